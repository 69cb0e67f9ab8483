"""Closed loop: decide -> (simulated) serve -> update_history -> decide ...

A tenant's true per-token acceptance follows a schedule. Each speculative request drafts
DRAFTED tokens, each accepted independently with the true rate, and folds the result into the
tenant's history with the policy's EWMA alpha; standard requests teach nothing. The caller's
state is exactly what the gateway keeps: the history entry and the last auto outcome.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest
from policy_helpers import bundle_with, context

from policies import Decision, HistoryEntry, PolicyBundle, decide, update_history

DRAFTED = 32
C_MEASURED = 0.1
KEY = ("draft", "2")


@dataclass(frozen=True)
class Step:
    true_acceptance: float
    decision: Decision


def simulate(bundle: PolicyBundle, schedule: list[float], seed: int) -> list[Step]:
    rng = random.Random(seed)
    alpha = bundle.policy_for("t").auto.ewma_alpha
    entry: HistoryEntry | None = None
    previous: str | None = None
    steps = []
    for i, a_true in enumerate(schedule):
        ctx = context(
            history={KEY: entry} if entry is not None else {},
            previous_mode=previous,
            probe_draw=rng.random(),
            decision_id=f"sim-{i}",
        )
        decision = decide(bundle, ctx)
        if decision.mode == "speculative":
            accepted = sum(rng.random() < a_true for _ in range(DRAFTED))
            entry = update_history(entry, DRAFTED, accepted, C_MEASURED, alpha)
        if decision.auto_outcome is not None:
            previous = decision.auto_outcome
        steps.append(Step(a_true, decision))
    return steps


def first_index(steps: list[Step], start: int, outcome: str) -> int | None:
    for i in range(start, len(steps)):
        if steps[i].decision.auto_outcome == outcome:
            return i - start + 1
    return None


def switches(steps: list[Step]) -> int:
    outcomes = [s.decision.auto_outcome for s in steps]
    return sum(a != b for a, b in itertools.pairwise(outcomes))


GOOD, BAD = 0.8, 0.05
# Shipped default: margin 0.1, hysteresis 0.05, half-life 10 requests, min_samples 20, probe 5%.
# From a = 0.8 the EWMA needs about 29 requests to fall below a = 0.155, where the best
# speedup S (k = 1, c = 0.1) drops under 1 + margin - hysteresis = 1.05.
COLLAPSE_BOUND = 40
# Back up needs a few probes (a > 0.27, S > 1.15) at 5% each: expected ~60 requests.
RECOVERY_BOUND = 250


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_collapse_switches_to_standard_and_probes_bring_it_back(seed: int) -> None:
    bundle = bundle_with()
    phase1, phase2, phase3 = 150, 300, 400
    steps = simulate(bundle, [GOOD] * phase1 + [BAD] * phase2 + [GOOD] * phase3, seed)

    # Phase 1: good acceptance -> speculative throughout (cold start on the prior included).
    assert all(s.decision.mode == "speculative" for s in steps[:phase1])
    assert steps[phase1 - 1].decision.inputs["history_source"] == "tenant"

    # Phase 2: acceptance collapses -> standard within the bound, and stays standard.
    n = first_index(steps, phase1, "standard")
    assert n is not None and n <= COLLAPSE_BOUND, n
    after = steps[phase1 + n - 1 : phase1 + phase2]
    assert all(s.decision.auto_outcome == "standard" for s in after)
    probes = [s for s in after if "probe" in s.decision.reason_codes]
    assert all(s.decision.mode == "speculative" for s in probes)
    assert all(s.decision.mode == "standard" for s in after if s not in probes)
    assert 1 <= len(probes) <= 0.15 * len(after)  # probe_rate 0.05, with slack

    # Phase 3: acceptance recovers -> probes refresh the history -> back to speculative.
    m = first_index(steps, phase1 + phase2, "speculative")
    assert m is not None and m <= RECOVERY_BOUND, m
    tail = steps[phase1 + phase2 + m - 1 :]
    assert all(s.decision.mode == "speculative" for s in tail)


def test_without_probes_a_collapsed_tenant_never_recovers() -> None:
    # The recovery above is the probes' doing: with probe_rate 0 history never refreshes.
    bundle = bundle_with({"auto": {"probe_rate": 0.0}})
    steps = simulate(bundle, [GOOD] * 150 + [BAD] * 100 + [GOOD] * 400, seed=1)
    assert first_index(steps, 250, "speculative") is None


# a = 0.21 puts the best speedup right at the threshold: S = (1 + a) / 1.1 = 1.1 = 1 + margin.
THRESHOLD_ACCEPTANCE = 0.21


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_no_flapping_under_steady_acceptance_near_the_threshold(seed: int) -> None:
    schedule = [THRESHOLD_ACCEPTANCE] * 1500
    with_hysteresis = switches(simulate(bundle_with(), schedule, seed))
    without = switches(simulate(bundle_with({"auto": {"hysteresis": 0.0}}), schedule, seed))
    assert with_hysteresis <= 2, with_hysteresis
    # Same noise, no band: the outcome flips back and forth (this is what hysteresis prevents).
    assert without >= 10, without
