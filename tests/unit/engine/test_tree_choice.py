"""batch/tree_choice.py: the rows of a step draft trees while trees give the batch more
tokens per second at its row bucket than chains, learned from its own steps (warm-up steps
of each mode, then by rate, every EXPLORE-th step the other mode); seeded sampled rows
keep their trees; the rates are kept per target model and row bucket."""

from __future__ import annotations

from types import SimpleNamespace

from gateway.engine.batch import tree_choice
from gateway.engine.batch.tree_choice import EXPLORE, WARM, ModeRate, TreeChoice, pick


def modes(tree_rate: float, chain_rate: float) -> dict[bool, ModeRate]:
    out = {True: ModeRate(), False: ModeRate()}
    for _ in range(WARM):
        out[True].observe(round(tree_rate * 10), 10.0)
        out[False].observe(round(chain_rate * 10), 10.0)
    return out


def test_warm_up_runs_both_modes() -> None:
    m = {True: ModeRate(), False: ModeRate()}
    picks = []
    for step in range(1, 2 * WARM + 1):
        on = pick(m, step)
        picks.append(on)
        m[on].observe(3, 0.01)
    assert picks == [True] * WARM + [False] * WARM


def test_the_faster_mode_wins_and_the_other_is_explored() -> None:
    for tree, chain, want in ((4.0, 3.0, True), (2.0, 3.0, False)):
        m = modes(tree, chain)
        picks = [pick(m, step) for step in range(1, EXPLORE + 1)]
        assert picks.count(want) == EXPLORE - 1 and picks[-1] is (not want)


def test_mode_rate_is_tokens_over_seconds() -> None:
    r = ModeRate()
    r.observe(8, 0.02)
    assert r.rate == 400.0
    r.observe(0, 0.02)
    assert r.tokens == 6.0 and r.rate == 300.0


def row(tree: bool, measure_c: bool):  # type: ignore[no-untyped-def]
    proposer = SimpleNamespace(tree=(3, 2) if tree else None, tree_on=None)
    policy = SimpleNamespace(measure_c=measure_c)
    return SimpleNamespace(cfg=SimpleNamespace(proposer=proposer, policy=policy))


def test_rows_switch_together_by_bucket_and_seeded_rows_keep_trees(monkeypatch) -> None:
    choice = TreeChoice()
    rows = [row(True, True), row(True, True), row(True, False), row(False, True)]
    learned = choice.learned
    learned.modes[8] = modes(2.0, 3.0)  # at 5-8 rows chains pay
    learned.modes[1] = modes(4.0, 3.0)  # alone trees pay
    choice.choose(rows, 8)  # type: ignore[arg-type]
    assert [r.cfg.proposer.tree_on for r in rows] == [False, False, True, None]
    choice.observe(12)
    assert learned.modes[8][False].steps == WARM + 1
    choice.choose(rows[:1], 1)  # type: ignore[arg-type]
    assert rows[0].cfg.proposer.tree_on is True


def test_rates_are_kept_per_model() -> None:
    a, b = object.__new__(type("M", (), {})), object.__new__(type("M", (), {}))
    assert tree_choice.learned_for(a) is tree_choice.learned_for(a)
    assert tree_choice.learned_for(a) is not tree_choice.learned_for(b)
