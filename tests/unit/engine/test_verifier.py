"""The verifier emits exactly the target distribution: by enumeration, and statistically
(with negative controls that must be caught)."""

from __future__ import annotations

import math

import pytest
import torch

from gateway.engine.constraints import TokenSequencesGrammar
from gateway.engine.constraints.base import next_token_mask
from gateway.engine.sampling import LogitsShaper, apply_top_p, argmax_rows, warp
from gateway.engine.schema import SamplingParams
from gateway.engine.verifier import (
    Verdict,
    acceptance_probability,
    one_hot_rows,
    residual,
    verify_greedy,
    verify_sampled,
)

# -- exact enumeration -------------------------------------------------------------------


def emitted_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact distribution of the token emitted at draft position 1, for p, q (V,) fp64:
    sum over x ~ q accepted with min(1, p/q), plus P(reject) * residual(p, q)."""
    drafted = q > 0
    acc = torch.zeros_like(p)
    acc[drafted] = acceptance_probability(p[drafted], q[drafted])
    accepted = q * acc  # (V,) mass emitted through acceptance
    return accepted + (1.0 - accepted.sum()) * residual(p, q)


def random_logits(gen: torch.Generator, vocab: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(vocab, generator=gen, dtype=torch.float64) * scale


@pytest.mark.parametrize("vocab", [2, 5, 12])
@pytest.mark.parametrize("trial", range(20))
def test_rejection_sampling_emits_p_exactly(vocab: int, trial: int) -> None:
    gen = torch.Generator().manual_seed(1000 * vocab + trial)
    p = torch.softmax(random_logits(gen, vocab), -1)
    q = torch.softmax(random_logits(gen, vocab), -1)
    torch.testing.assert_close(emitted_distribution(p, q), p, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"),
    [(1.0, 1.0, 0), (0.5, 1.0, 0), (1.7, 0.8, 0), (1.0, 1.0, 3), (0.8, 0.6, 4), (1.2, 0.3, 0)],
)
@pytest.mark.parametrize("trial", range(10))
def test_exact_after_warping(temperature: float, top_p: float, top_k: int, trial: int) -> None:
    vocab = 9
    gen = torch.Generator().manual_seed(trial)
    p = warp(random_logits(gen, vocab)[None], temperature, top_p, top_k)[0]
    q = warp(random_logits(gen, vocab)[None], temperature, top_p, top_k)[0]
    torch.testing.assert_close(emitted_distribution(p, q), p, atol=1e-6, rtol=0)
    if top_k:
        assert int((p > 0).sum()) <= top_k


@pytest.mark.parametrize("trial", range(10))
def test_exact_with_one_hot_draft(trial: int) -> None:
    """Prompt lookup / prediction: q is one-hot at the drafted token."""
    vocab = 7
    gen = torch.Generator().manual_seed(50 + trial)
    p = torch.softmax(random_logits(gen, vocab), -1)
    for d in range(vocab):
        q = one_hot_rows(torch.tensor([d]), vocab, torch.float64)[0]
        torch.testing.assert_close(emitted_distribution(p, q), p, atol=1e-6, rtol=0)


@pytest.mark.parametrize("trial", range(10))
def test_exact_with_grammar_mask(trial: int) -> None:
    """p and q masked by the same grammar: what is emitted is the masked target p."""
    vocab = 10
    gen = torch.Generator().manual_seed(200 + trial)
    grammar = TokenSequencesGrammar([[1, 2], [3, 4], [5], [7, 1]])
    cpu = torch.device("cpu")
    mask = next_token_mask(grammar, vocab, (0,), cpu)[None]  # (1, V)
    shaper = LogitsShaper.from_params(SamplingParams(temperature=0.9, top_p=0.95), vocab, cpu)
    p = shaper.probs(shaper.shape(random_logits(gen, vocab)[None], mask))[0].double()
    q = shaper.probs(shaper.shape(random_logits(gen, vocab)[None], mask))[0].double()
    assert set(torch.nonzero(p).flatten().tolist()) <= {1, 3, 5, 7}
    torch.testing.assert_close(emitted_distribution(p, q), p, atol=1e-6, rtol=0)


def test_enumeration_catches_a_wrong_residual() -> None:
    """Negative control for the enumeration: sampling the residual from p is not exact."""
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(random_logits(gen, 6), -1)
    q = torch.softmax(random_logits(gen, 6), -1)
    acc = acceptance_probability(p, q)
    wrong = q * acc + (1 - (q * acc).sum()) * p
    assert (wrong - p).abs().max() > 1e-3


def test_top_p_keeps_smallest_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(apply_top_p(logits, 0.8))[0].tolist()
    assert kept == [True, True, False, False]
    kept = torch.isfinite(apply_top_p(logits, 0.81))[0].tolist()
    assert kept == [True, True, True, False]


@pytest.mark.parametrize("top_p", [5e-324, 1e-300, 1e-46])
def test_a_top_p_below_float32_keeps_the_most_likely_token(top_p: float) -> None:
    """5e-324 rounds to 0 against float32 probabilities: every token was dropped, softmax
    gave NaN and sampling raised (a 500 the fuzzer found)."""
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]]))
    kept = torch.isfinite(apply_top_p(logits, top_p))[0].tolist()
    assert kept == [False, True, False]
    p = warp(logits, 1.0, top_p, 0)
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0]]))


def test_verify_greedy() -> None:
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]) == Verdict(2, 9)
    assert verify_greedy([5, 6, 7], [5, 6, 7, 1]) == Verdict(3, 1)
    assert verify_greedy([], [4]) == Verdict(0, 4)
    assert verify_greedy([3], [4, 8]) == Verdict(0, 4)


def test_greedy_tokens_are_torchs_argmax_on_every_path() -> None:
    """argmax_rows (numpy on CPU fp32) picks what torch's argmax picks: the first of tied
    maxima, a NaN as the maximum, a row of -inf (a dead end's), strided rows, other dtypes."""
    inf, nan = float("inf"), float("nan")
    z = torch.tensor(
        [[1.0, 3.0, 3.0, 0.0], [-inf] * 4, [1.0, nan, 5.0, nan], [2.0] * 4, [inf, 1.0, inf, 0.0]]
    )
    assert argmax_rows(z) == z.argmax(-1).tolist() == [1, 0, 1, 0, 0]
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(9, 8192, generator=g)
    wide[:, 4000] = wide.max() + 1
    wide[:, 7000] = wide.max()  # a tie with position 4000: the first one wins
    assert argmax_rows(wide) == [4000] * 9
    strided = torch.randn(4, 3, 8192, generator=g)[:, 1]
    assert not strided.is_contiguous()
    assert argmax_rows(strided) == strided.argmax(-1).tolist()
    half = wide.to(torch.bfloat16)
    assert argmax_rows(half) == half.argmax(-1).tolist()


# -- statistical test over short sequences with the real verify_sampled -----------------

VOCAB, LENGTH, K = 4, 3, 2


def table(seed: int, sharp: float) -> dict[tuple[int, ...], torch.Tensor]:
    """A conditional distribution over VOCAB for every prefix shorter than LENGTH + K."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[tuple[int, ...], torch.Tensor] = {}
    prefixes: list[tuple[int, ...]] = [()]
    for _ in range(LENGTH + K):
        nxt = []
        for pre in prefixes:
            out[pre] = torch.softmax(torch.randn(VOCAB, generator=gen) * sharp, -1)
            nxt.extend((*pre, t) for t in range(VOCAB))
        prefixes = nxt
    return out


P_TABLE, Q_TABLE = table(11, 1.5), table(12, 1.5)


def exact_sequence_probs() -> dict[tuple[int, ...], float]:
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(LENGTH):
        probs = {
            (*pre, t): pr * float(P_TABLE[pre][t])
            for pre, pr in probs.items()
            for t in range(VOCAB)
        }
    return probs


def speculative_sequence(rule, gen: torch.Generator) -> tuple[int, ...]:
    """Speculative decoding of LENGTH tokens with k = min(K, remaining - 1), using `rule`."""
    seq: tuple[int, ...] = ()
    while len(seq) < LENGTH:
        k = min(K, LENGTH - len(seq) - 1)
        draft, q_rows = [], []
        for _ in range(k):
            q = Q_TABLE[seq + tuple(draft)]
            draft.append(int(torch.multinomial(q, 1, generator=gen)))
            q_rows.append(q)
        p_rows = torch.stack([P_TABLE[seq + tuple(draft[:j])] for j in range(k + 1)])
        q_t = torch.stack(q_rows) if q_rows else None
        verdict = rule(torch.tensor(draft, dtype=torch.long), q_t, p_rows, gen)
        seq = seq + tuple(draft[: verdict.accepted]) + (verdict.token,)
    return seq[:LENGTH]


def always_accept(draft, draft_probs, target_probs, gen) -> Verdict:
    n = draft.shape[0]
    return Verdict(n, int(torch.multinomial(target_probs[n], 1, generator=gen)))


def residual_from_p(draft, draft_probs, target_probs, gen) -> Verdict:
    """Wrong on purpose: on rejection, sample from p instead of max(0, p - q)."""
    v = verify_sampled(draft, draft_probs, target_probs, gen)
    if v.accepted < draft.shape[0]:
        return Verdict(
            v.accepted, int(torch.multinomial(target_probs[v.accepted], 1, generator=gen))
        )
    return v


def chi_square(rule, samples: int, seed: int) -> tuple[float, float]:
    """Pearson chi-square of sampled sequences vs the exact target, low cells pooled.
    Returns (statistic, critical value at p = 1e-4 by Wilson-Hilferty)."""
    gen = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(samples):
        s = speculative_sequence(rule, gen)
        counts[s] = counts.get(s, 0) + 1
    exact = exact_sequence_probs()
    cells, pooled_obs, pooled_exp = [], 0.0, 0.0
    for s, pr in exact.items():
        if pr * samples < 5:
            pooled_obs += counts.get(s, 0)
            pooled_exp += pr * samples
        else:
            cells.append((counts.get(s, 0), pr * samples))
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    z = 3.719  # upper 1e-4 quantile of N(0, 1)
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, critical


def test_rejection_sampler_statistically_matches_target() -> None:
    stat, critical = chi_square(verify_sampled, samples=4000, seed=7)
    assert stat < critical, (stat, critical)


@pytest.mark.parametrize("wrong_rule", [always_accept, residual_from_p])
def test_statistical_test_rejects_wrong_rules(wrong_rule) -> None:
    stat, critical = chi_square(wrong_rule, samples=4000, seed=7)
    assert stat > critical, (stat, critical)
