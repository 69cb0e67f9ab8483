"""Sampled exactness inside a batch: a speculative row sharing its target and draft forwards
with neighbours still emits the target's distribution (chi-square over the first token,
with the negative control of test_draft_head.py failing the same test)."""

from __future__ import annotations

import pytest
import torch

from gateway.engine import DecodeRequest, Engine, SamplingParams
from gateway.engine import loop as loop_module
from gateway.engine.schema import Finished
from gateway.engine.verifier import Verdict, verify_sampled
from gateway.speed import wrap_fast
from tests.support.models import llama

from .test_draft_head import (
    EOS,
    PROMPT,
    SAMPLES,
    TOKENIZER,
    TOP_K,
    VOCAB,
    chi_square_vs_target,
    sampled_draft,
)  # fmt: skip

ROWS = 6  # measured rows per batch, beside two neighbours


@pytest.fixture(scope="module")
def eng() -> Engine:
    return Engine(wrap_fast(llama(VOCAB, EOS, seed=6, init=0.3), TOKENIZER))


def batched_first_token_counts(eng: Engine, draft) -> tuple[torch.Tensor, int, int]:
    counts = torch.zeros(VOCAB)
    drafted = shared = 0
    spec = {"mode": "speculative", "proposer": "draft", "k_min": 1, "k_max": 1}
    for start in range(0, SAMPLES, ROWS):
        batch = eng.batch(ROWS + 2)
        mine = set()
        for seed in range(start, min(start + ROWS, SAMPLES)):
            sp = SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=2, seed=seed)
            mine.add(id(batch.add(eng.prepare(DecodeRequest(PROMPT, sp, **spec), draft))))
        noisy = SamplingParams(temperature=0.7, max_tokens=3)  # unseeded neighbours
        batch.add(eng.prepare(DecodeRequest((3, 1, 4, 1, 5), noisy, **spec), draft))
        batch.add(eng.prepare(DecodeRequest((9, 8), SamplingParams(max_tokens=4))))
        while batch.rows:
            for row, events in batch.step():
                for e in events:
                    assert not isinstance(e, Exception), e
                    if isinstance(e, Finished) and id(row) in mine:
                        counts[e.result.token_ids[0]] += 1
                        drafted += e.result.stats.drafted
                        shared += e.result.stats.mean_batch_rows > 1
    return counts, drafted, shared


def test_a_row_inside_a_batch_samples_the_target_distribution(eng) -> None:
    counts, drafted, shared = batched_first_token_counts(eng, sampled_draft(eng))
    assert drafted > SAMPLES // 2 and shared == SAMPLES  # drafted, and in company
    stat, critical = chi_square_vs_target(eng, counts)
    assert stat < critical, (stat, critical)


def test_the_batched_test_catches_a_residual_that_ignores_q(eng, monkeypatch) -> None:
    def residual_from_p(draft, q, p, gen) -> Verdict:
        v = verify_sampled(draft, q, p, gen)
        if v.accepted < draft.shape[0]:
            return Verdict(v.accepted, int(torch.multinomial(p[v.accepted], 1, generator=gen)))
        return v

    monkeypatch.setattr(loop_module, "verify_sampled", residual_from_p)
    counts, _, _ = batched_first_token_counts(eng, sampled_draft(eng))
    stat, critical = chi_square_vs_target(eng, counts)
    assert stat > critical, (stat, critical)
