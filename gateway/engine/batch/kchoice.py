"""One k per batch step: the draft length that maximises the batch's expected tokens/second.

A verify forward is padded to its longest row, and draft forwards are shared by the rows
of a draft, so a batch step costs about

    T(B, 1 + max_r k_r) + sum over drafts d of max_{r in d} k_r * D_d(n_d) + O(B)

(T: the target's measured forward seconds for B rows of that many tokens; D_d: draft d's
for its n_d drafting rows; O: the measured seconds a step spends outside its forwards,
a drafting step's when any row drafts, batch/costs.py `overhead`) and emits
sum_r E(a_r, k_r) tokens (E of gateway/costmodel.py; a standard row emits 1). Each step
the batch tries k = 0..k_max for its adaptive rows (speculative rows whose k policy
measures: not seeded sampled ones, whose k must stay their own so that the seed alone
fixes the text), each row's k clamped to its bounds (0 allowed only where its request may
pause), and sets the best as every adaptive row's `batch_k`.
Rows keep their own acceptance estimate a_r. Greedy output never depends on k, and any k
is exact for sampled output, so this choice changes speed only.

With no measured target costs at the batch's row bucket for at least two token counts
(no probe yet), nothing is chosen and each row picks its own k as alone.

Exploration: the costs of a shape are re-measured only when a step runs it, so one noisy
probe (a forward of 3 tokens timed at twice its real cost, seen on this 2-core machine)
would keep its k from ever being chosen again. Every EXPLORE_EVERY-th step the batch runs
a neighbour of the best k instead (one above, then one below, in turn), so the estimates
around the choice keep following the machine. Neither output nor exactness depends on k.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.costmodel import expected_tokens
from gateway.engine.batch.costs import ForwardCosts, row_bucket
from gateway.engine.loop import LoopConfig
from gateway.engine.models import LoadedModel
from gateway.engine.proposers.base import Proposer

EXPLORE_EVERY = 16  # steps between two runs of a neighbouring k


def explore_offset(step: int) -> int:
    """The offset from the best k that batch step `step` runs: +1 and -1 in turn every
    EXPLORE_EVERY steps, else 0."""
    if step % EXPLORE_EVERY != EXPLORE_EVERY - 1:
        return 0
    return 1 if (step // EXPLORE_EVERY) % 2 == 0 else -1


def choose_batch_k(
    cfgs: list[LoopConfig],
    target: ForwardCosts | None,
    drafts: Mapping[int, tuple[LoadedModel, ForwardCosts]],
    explore: int = 0,
) -> int | None:
    """Set `policy.batch_k` on the adaptive rows of `cfgs` (the rows decoding this step);
    returns the k chosen, or None when the rows choose alone. `explore` (explore_offset):
    run the best k plus this offset, within 0..the rows' largest k_max."""
    adaptive = [
        c for c in cfgs if c.policy is not None and c.proposer is not None and c.policy.measure_c
    ]
    for c in adaptive:
        assert c.policy is not None
        c.policy.batch_k = None
    rows = len(cfgs)
    if not adaptive or target is None or not _measured(target, rows):
        return None
    mine = {id(c) for c in adaptive}  # by identity: a LoopConfig compares field by field
    fixed = [(c, c.policy.choose()) for c in cfgs if c.proposer is not None and c.policy
             and id(c) not in mine]  # fmt: skip
    standard = rows - len(adaptive) - len(fixed)
    k_hi = max(c.policy.k_max for c in adaptive if c.policy is not None)
    best_k, best_rate = 0, -1.0
    # T(rows, 1 + k) for every k a row may run, read once per step (not once per candidate)
    verify = target.curve(rows, 1 + max([k_hi] + [kc for _, kc in fixed]))
    assert verify is not None  # _measured above
    overhead = {d: target.overhead(rows, d) for d in (False, True)}
    draft_one: dict[tuple[int, int], float | None] = {}
    for k in range(k_hi + 1):
        ks = [(c, _clamp(c, k)) for c in adaptive] + fixed
        widest = max(kc for _, kc in ks)
        step_s = verify[widest] + overhead[widest > 0]
        step_s += _draft_seconds(ks, drafts, verify[0] + overhead[False], draft_one)
        tokens = standard + sum(
            expected_tokens(c.policy.acceptance, kc) for c, kc in ks if c.policy is not None
        )
        rate = tokens / step_s if step_s > 0 else 0.0
        if rate > best_rate * (1 + 1e-9):
            best_k, best_rate = k, rate
    best_k = min(max(best_k + explore, 0), k_hi)
    for c in adaptive:
        assert c.policy is not None
        c.policy.batch_k = best_k
    return best_k


def _measured(costs: ForwardCosts, rows: int) -> bool:
    b = row_bucket(rows)
    return len({t for (rb, t) in costs.means if rb == b}) >= 2


def _clamp(cfg: LoopConfig, k: int) -> int:
    p = cfg.policy
    assert p is not None
    return min(max(k, 0 if p.may_pause else p.k_min), p.k_max)


def _draft_seconds(
    ks: list[tuple[LoopConfig, int]],
    drafts: Mapping[int, tuple[LoadedModel, ForwardCosts]],
    standard_s: float,
    one_forward: dict[tuple[int, int], float | None],
) -> float:
    """Seconds of the shared draft forwards for these k: per draft, its deepest row's k
    times one forward of its drafting rows (unmeasured: the rows' c times a standard step);
    plus, per row whose model drafts alone (a feature head), k times its c times a standard
    step; `one_forward` keeps the lookups of one step by (draft, rows)."""
    total = 0.0
    for key, (lm, costs) in drafts.items():
        mine = [(c, kc) for c, kc in ks if kc > 0 and _draws_on(c.proposer, lm)]
        if not mine:
            continue
        depth = max(kc for _, kc in mine)
        if (key, len(mine)) not in one_forward:
            one_forward[(key, len(mine))] = costs.seconds(len(mine), 1)
        one = one_forward[(key, len(mine))]
        if one is None:
            one = max(c.policy.c for c, _ in mine if c.policy is not None) * standard_s
        total += depth * one
    for c, kc in ks:  # a model drafting alone, a row at a time (a feature head)
        alone = c.proposer is not None and c.proposer.shared_draft() is None
        if kc > 0 and alone and hasattr(c.proposer, "forward_s") and c.policy is not None:
            total += kc * c.policy.c * standard_s
    return total


def _draws_on(proposer: Proposer | None, lm: LoadedModel) -> bool:
    """Whether `proposer` drafts in the shared forwards of draft model `lm`."""
    shared = None if proposer is None else proposer.shared_draft()
    return shared is not None and shared.draft is lm
