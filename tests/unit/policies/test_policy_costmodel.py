"""The cost model (Leviathan et al.) and the EWMA history update."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.engine.stats import DecodeStats
from policies import HistoryEntry, best_k, expected_speedup, expected_tokens, update_history
from policies.costmodel import alpha_from_half_life


@pytest.mark.parametrize(
    ("a", "k", "c", "want"),
    [
        (0.0, 4, 0.1, 1 / 1.4),  # nothing accepted: one token per (k c + 1) cost
        (1.0, 4, 0.0, 5.0),  # everything accepted, free drafts: k + 1 tokens per forward
        (1.0, 4, 0.25, 2.5),
        (0.8, 4, 0.1, (1 - 0.8**5) / (0.2 * 1.4)),
        (0.5, 1, 0.0, 1.5),
    ],
)
def test_expected_speedup_values(a: float, k: int, c: float, want: float) -> None:
    assert expected_speedup(a, k, c) == pytest.approx(want)


@given(a=st.floats(0.0, 0.999), k=st.integers(1, 16))
def test_expected_tokens_is_the_geometric_sum(a: float, k: int) -> None:
    assert expected_tokens(a, k) == pytest.approx(sum(a**i for i in range(k + 1)))


@given(a=st.floats(0.0, 1.0), c=st.floats(0.0, 2.0), lo=st.integers(1, 8), w=st.integers(0, 8))
def test_best_k_is_the_argmax(a: float, c: float, lo: int, w: int) -> None:
    k, s = best_k(a, c, lo, lo + w)
    values = {j: expected_speedup(a, j, c) for j in range(lo, lo + w + 1)}
    assert lo <= k <= lo + w
    assert s == values[k] == max(values.values())
    assert all(values[j] < s for j in range(lo, k))  # ties go to the smallest k


def test_speculation_pays_only_when_acceptance_beats_cost() -> None:
    # a <= c: no k helps (S <= 1); a > c: k = 1 already helps.
    assert best_k(0.1, 0.1, 1, 16)[1] <= 1.0 + 1e-12
    assert best_k(0.2, 0.1, 1, 16)[1] > 1.0


def test_invalid_inputs_raise() -> None:
    with pytest.raises(ValueError):
        expected_speedup(1.5, 2, 0.1)
    with pytest.raises(ValueError):
        expected_speedup(0.5, 2, -0.1)
    with pytest.raises(ValueError):
        best_k(0.5, 0.1, 3, 2)


def test_update_history_first_sample_initialises() -> None:
    entry = update_history(None, drafted=10, accepted=7, c=0.12, alpha=0.2)
    assert entry == HistoryEntry(acceptance=0.7, c=0.12, samples=1)


def test_update_history_ewma() -> None:
    old = HistoryEntry(acceptance=0.5, c=0.1, samples=4)
    new = update_history(old, drafted=10, accepted=10, c=0.2, alpha=0.25)
    assert new.acceptance == pytest.approx(0.75 * 0.5 + 0.25 * 1.0)
    assert new.c == pytest.approx(0.75 * 0.1 + 0.25 * 0.2)
    assert new.samples == 5


def test_update_history_without_c_keeps_it() -> None:
    old = HistoryEntry(acceptance=0.5, c=0.1, samples=4)
    assert update_history(old, 4, 0, None, 0.5) == HistoryEntry(0.25, 0.1, 5)
    assert update_history(None, 4, 2, None, 0.5).c == 0.0


def test_update_history_nothing_drafted_is_no_acceptance_evidence() -> None:
    old = HistoryEntry(acceptance=0.5, c=0.1, samples=4)
    assert update_history(old, 0, 0, None, 0.5) == old
    assert update_history(None, 0, 0, 0.1, 0.5).samples == 0


def test_history_acceptance_is_the_per_token_rate_the_cost_model_assumes() -> None:
    """Drafts of 4 whose tokens the target accepts with probability 0.8 each until the
    first rejection: accepted / drafted reads about 0.59, and E(0.59, 4) would predict 2.6
    tokens a step against the 3.4 served. accepted / (accepted + rejecting steps) reads
    the 0.8 back, and E of it is what a step emits."""
    rng = random.Random(7)
    stats = DecodeStats()
    emitted = []
    for _ in range(4000):
        m = 0
        while m < 4 and rng.random() < 0.8:
            m += 1
        stats.record_verify(4, m)
        emitted.append(m + 1)
    assert stats.acceptance_rate == pytest.approx(0.59, abs=0.02)
    assert stats.token_acceptance == pytest.approx(0.8, abs=0.015)
    entry = update_history(None, stats.drafted, stats.accepted, None, 0.5, stats.rejected_steps)
    assert entry.acceptance == pytest.approx(stats.token_acceptance)
    served = sum(emitted) / len(emitted)
    assert expected_tokens(entry.acceptance, 4) == pytest.approx(served, rel=0.03)
    assert expected_tokens(stats.acceptance_rate, 4) < 0.8 * served
    old = HistoryEntry(acceptance=0.5, c=0.1, samples=4)
    new = update_history(old, drafted=10, accepted=6, c=None, alpha=0.5, rejections=2)
    assert new.acceptance == pytest.approx(0.5 * 0.5 + 0.5 * 0.75)
    assert update_history(old, 0, 0, None, 0.5, rejections=0) == old  # no evidence
    with pytest.raises(ValueError):
        update_history(old, 10, 6, None, 0.5, rejections=5)  # more than 4 were rejected


@pytest.mark.parametrize(
    ("drafted", "accepted", "c", "alpha"),
    [
        (-1, 0, None, 0.5),
        (3, 4, None, 0.5),
        (3, -1, None, 0.5),
        (3, 1, -0.1, 0.5),
        (3, 1, None, 0.0),
        (3, 1, None, 1.5),
        (3, 1, float("nan"), 0.5),
    ],
)
def test_update_history_refuses_bad_numbers(
    drafted: int, accepted: int, c: float | None, alpha: float
) -> None:
    with pytest.raises(ValueError):
        update_history(None, drafted, accepted, c, alpha)


@given(
    start=st.floats(0.0, 1.0),
    obs=st.lists(st.tuples(st.integers(1, 64), st.floats(0.0, 1.0)), max_size=30),
    alpha=st.floats(0.01, 1.0),
)
def test_update_history_stays_in_range(
    start: float, obs: list[tuple[int, float]], alpha: float
) -> None:
    entry = HistoryEntry(start, 0.1, 1)
    for drafted, frac in obs:
        entry = update_history(entry, drafted, round(frac * drafted), 0.1, alpha)
        assert 0.0 <= entry.acceptance <= 1.0
    assert entry.samples == 1 + len(obs)


def test_half_life_means_half_the_weight() -> None:
    alpha = alpha_from_half_life(10)
    assert (1 - alpha) ** 10 == pytest.approx(0.5)
    with pytest.raises(ValueError):
        alpha_from_half_life(0)
