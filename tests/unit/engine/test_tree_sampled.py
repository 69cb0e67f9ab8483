"""Sampled tree rows end to end: the first token of a seeded sampled request drafting a
tree of three i.i.d. candidates (k = 1, shape (3,)) follows the target's distribution
(chi-square, as test_draft_head.py's chain test), and the same test fails a tree rule that
keeps a rejected candidate's mass in the residual."""

from __future__ import annotations

import pytest
import torch

from gateway.engine import DecodeRequest, Engine, SamplingParams, tree_step
from gateway.speed import wrap_fast
from tests.support.models import llama
from tests.support.spies import count_calls

from .test_draft_head import (
    EOS,
    PROMPT,
    SAMPLES,
    TOKENIZER,
    TOP_K,
    VOCAB,
    chi_square_vs_target,
    sampled_draft,
)


@pytest.fixture(scope="module")
def eng() -> Engine:
    """test_draft_head.py's target."""
    return Engine(wrap_fast(llama(VOCAB, EOS, seed=6, init=0.3), TOKENIZER))


def tree_first_tokens(eng: Engine, draft) -> tuple[torch.Tensor, int]:  # type: ignore[no-untyped-def]
    counts = torch.zeros(VOCAB)
    drafted = 0
    for seed in range(SAMPLES):
        sp = SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=2, seed=seed)
        req = DecodeRequest(PROMPT, sp, mode="speculative", proposer="draft", k_min=1, k_max=1,
                            tree=(3,))  # fmt: skip
        res = eng.run(req, draft=draft)
        counts[res.token_ids[0]] += 1
        drafted += res.stats.drafted
    return counts, drafted


def test_sampled_tree_rows_have_the_target_distribution(eng, monkeypatch) -> None:
    calls = count_calls(monkeypatch, tree_step, "verify_tree_sampled")
    counts, drafted = tree_first_tokens(eng, sampled_draft(eng))
    assert drafted > SAMPLES // 2 and calls[0] >= SAMPLES // 2
    stat, critical = chi_square_vs_target(eng, counts)
    assert stat < critical, (stat, critical)


def test_the_chi_square_test_catches_a_tree_rule_that_keeps_rejected_mass(eng, monkeypatch) -> None:
    """Negative control: after a rejected candidate, the next is tested against the same
    residual (its q not taken out)."""
    real = tree_step.verify_tree_sampled

    def wrong(*a, **kw):  # type: ignore[no-untyped-def]
        return real(*a, **kw, residual_of=lambda r, q: r)

    monkeypatch.setattr(tree_step, "verify_tree_sampled", wrong)
    counts, _ = tree_first_tokens(eng, sampled_draft(eng))
    stat, critical = chi_square_vs_target(eng, counts)
    assert stat > critical, (stat, critical)
