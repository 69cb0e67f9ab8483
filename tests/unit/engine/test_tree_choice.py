"""batch/tree_choice.py: a row's tree stays on where its rate (tokens per step over the
verify forward's measured cost at this batch plus drafting) beats the chain's, and goes off
where the wider feed costs more than it brings (a full batch on this CPU)."""

from __future__ import annotations

from gateway.engine.batch.costs import ForwardCosts
from gateway.engine.batch.tree_choice import EXPLORE, WARM, ModeStats, RowTrees, _pick


def costs(per_token: dict[int, float]) -> ForwardCosts:
    """Seconds of a forward by rows, linear in the tokens per row: per_token[rows]."""
    c = ForwardCosts()
    for rows, slope in per_token.items():
        for tokens in (1, 5, 10, 20):
            c.observe(rows, tokens, 0.01 + slope * tokens)
    return c


def row(tree_tokens: float, chain_tokens: float) -> RowTrees:
    """A row whose trees fed 16 tokens and emitted `tree_tokens` a step, chains 6 and
    `chain_tokens`, drafting 1 ms a step either way."""
    state = RowTrees()
    for _ in range(WARM):
        state.tree.observe(round(tree_tokens), 16, 0.001)
        state.chain.observe(round(chain_tokens), 6, 0.001)
    state.steps = 2 * WARM
    return state


def test_warm_up_runs_both_modes() -> None:
    state = RowTrees()
    picks = []
    for _ in range(2 * WARM):
        on = _pick(state, None, 1)
        picks.append(on)
        (state.tree if on else state.chain).observe(3, 10, 0.0)
    assert picks == [True] * WARM + [False] * WARM


def test_a_tree_pays_alone_and_stops_paying_in_a_full_batch() -> None:
    # alone a 16-token forward costs little more than a 6-token one; at 8 rows, far more
    measured = costs({1: 0.0002, 8: 0.004})
    assert _pick(row(4, 3), measured, 1) is True
    assert _pick(row(4, 3), measured, 8) is False


def test_every_explore_th_step_runs_the_other_mode() -> None:
    measured = costs({1: 0.0002})
    state = row(4, 3)
    picks = [_pick(state, measured, 1) for _ in range(EXPLORE)]
    assert picks.count(False) == 1 and picks.count(True) == EXPLORE - 1


def test_without_costs_the_tree_stays_on() -> None:
    assert _pick(row(2, 3), None, 4) is True


def test_mode_stats_average() -> None:
    m = ModeStats()
    m.observe(4, 10, 0.0)
    assert (m.tokens, m.fed) == (4, 10)
    m.observe(0, 10, 0.0)
    assert m.tokens == 3.0
