"""A draft with a reduced output head (draft_vocab.json): loaded from the model directory,
exactly the full logits on its subset, refused for models whose logits are not
lm_head(hidden), and exact in both modes (sampled: by a chi-square test with a negative
control)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from transformers import DynamicCache

from gateway.engine import DecodeRequest, Engine, SamplingParams
from gateway.engine import loop as loop_module
from gateway.engine.draft_head import DRAFT_VOCAB_FILE, build_head, head_logits
from gateway.engine.models import cache_kwarg, forward_logits
from gateway.engine.proposers.draft_model import DraftModelProposer
from gateway.engine.verifier import Verdict, verify_sampled
from gateway.speed import load_fast, wrap_fast
from tests.support.models import build_tokenizer, llama, save

TOKENIZER = build_tokenizer()
VOCAB, EOS = len(TOKENIZER), TOKENIZER.eos_token_id
PROMPT = (10, 20, 30, 40, 50)


def test_draft_vocab_file_is_read_and_can_be_ignored(tmp_path) -> None:
    path = save(llama(VOCAB, EOS, seed=3, layers=1), TOKENIZER, tmp_path / "d")
    (path / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": [5, 1, 9, 5]}))
    lm = load_fast(path, device="cpu")
    assert lm.draft_head is not None
    assert lm.draft_head.token_ids.tolist() == [1, 5, 9]  # sorted, unique
    assert load_fast(path, device="cpu", draft_vocab=False).draft_head is None
    (path / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": [1, VOCAB]}))
    with pytest.raises(ValueError, match="ids in"):
        load_fast(path, device="cpu")
    (path / DRAFT_VOCAB_FILE).write_text(json.dumps(["not", "ids"]))
    with pytest.raises(ValueError, match="token_ids"):
        load_fast(path, device="cpu")


def test_head_logits_are_the_full_logits_on_the_subset_step_by_step() -> None:
    """A prefill, then one-token KV-cached steps: each step's reduced logits equal the full
    model's on the subset (so the cache is fed and grown exactly like forward_logits')."""
    model = llama(VOCAB, EOS, seed=4, layers=2).eval()
    subset = list(range(0, VOCAB, 3))
    head = build_head(model, subset)
    kw, cpu = cache_kwarg(model), torch.device("cpu")
    full_cache, part_cache = DynamicCache(), DynamicCache()
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[subset] = False
    with torch.inference_mode():
        for ids in ([7, 8, 9, 10], [11], [12], [3, 4]):
            full = forward_logits(model, kw, ids, full_cache, cpu, 1)
            part = head_logits(model, head, kw, ids, part_cache, cpu)
            assert part.shape == (1, VOCAB)
            torch.testing.assert_close(part[0, subset], full[0, subset], atol=1e-5, rtol=1e-5)
            assert torch.isneginf(part[0, outside]).all()
            assert part_cache.get_seq_length() == full_cache.get_seq_length()


class ScaledLogits(torch.nn.Module):
    """A causal LM whose logits are 2 x lm_head(hidden) (like a logit scale)."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner

    @property
    def base_model(self):
        return self.inner.base_model

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, **kw):
        out = self.inner(**kw)
        out.logits = out.logits * 2
        return out


def test_a_model_whose_logits_are_not_lm_head_is_refused() -> None:
    model = ScaledLogits(llama(VOCAB, EOS, seed=5, layers=1)).eval()
    with pytest.raises(ValueError, match="not lm_head"):
        build_head(model, [1, 2, 3])


def perfect_draft_with_head(eng: Engine, subset: list[int]):
    """The target itself as draft, restricted to `subset`."""
    return wrap_fast(copy.deepcopy(eng.target.model), TOKENIZER, draft_vocab=subset)


@pytest.fixture(scope="module")
def eng() -> Engine:
    return Engine(wrap_fast(llama(VOCAB, EOS, seed=6, init=0.3), TOKENIZER))


def spy_on_drafts(monkeypatch) -> list[int]:
    """Every token the draft-model proposer proposes, in order."""
    drafted: list[int] = []
    original = DraftModelProposer.propose

    def propose(self, context_ids, k):
        proposal = original(self, context_ids, k)
        drafted.extend(proposal.tokens)
        return proposal

    monkeypatch.setattr(DraftModelProposer, "propose", propose)
    return drafted


def test_greedy_output_is_unchanged_and_only_subset_tokens_are_drafted(eng, monkeypatch) -> None:
    drafted = spy_on_drafts(monkeypatch)
    sp = SamplingParams(temperature=0.0, max_tokens=30)
    standard = eng.run(DecodeRequest(PROMPT, sp))
    outputs = set(standard.token_ids)
    inside = sorted(outputs)[: len(outputs) // 2]
    draft = perfect_draft_with_head(eng, inside)
    req = DecodeRequest(PROMPT, sp, mode="speculative", proposer="draft", k_min=4, k_max=4)
    spec = eng.run(req, draft=draft)
    assert spec.token_ids == standard.token_ids
    assert drafted and set(drafted) <= set(inside)
    # The target drafting for itself is right wherever its token is in the subset; every
    # output token outside the subset costs a rejection or ends a draft.
    assert 0 < spec.stats.accepted < len(standard.token_ids)
    full = eng.run(req, draft=perfect_draft_with_head(eng, list(range(VOCAB))))
    assert full.token_ids == standard.token_ids
    assert full.stats.accepted == full.stats.drafted


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafting_stops_when_nothing_in_the_subset_is_allowed(eng, temperature) -> None:
    allowed = tuple(range(60, 80))
    draft = perfect_draft_with_head(eng, list(range(0, 60)))
    sp = SamplingParams(temperature=temperature, max_tokens=12, allowed_token_ids=allowed, seed=3)
    req = DecodeRequest(PROMPT, sp, mode="speculative", proposer="draft", k_min=3, k_max=3)
    spec = eng.run(req, draft=draft)
    assert spec.token_ids == eng.run(DecodeRequest(PROMPT, sp)).token_ids
    assert set(spec.token_ids) <= set(allowed)
    assert len(spec.token_ids) == 12
    assert spec.stats.drafted == 0


# -- sampled exactness: the first emitted token has the target's distribution ------------

TOP_K, SAMPLES = 6, 3000


def first_token_counts(eng: Engine, draft) -> tuple[torch.Tensor, int]:
    counts = torch.zeros(VOCAB)
    drafted = 0
    for seed in range(SAMPLES):
        sp = SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=2, seed=seed)
        req = DecodeRequest(PROMPT, sp, mode="speculative", proposer="draft", k_min=1, k_max=1)
        res = eng.run(req, draft=draft)
        counts[res.token_ids[0]] += 1
        drafted += res.stats.drafted
    return counts, drafted


def chi_square_vs_target(eng: Engine, counts: torch.Tensor) -> tuple[float, float]:
    with torch.inference_mode():
        logits = eng.target.model(input_ids=torch.tensor([PROMPT])).logits[0, -1].double()
    top = torch.topk(logits, TOP_K)
    p = torch.softmax(top.values, -1)
    obs = counts[top.indices].double()
    assert int(counts.sum() - obs.sum()) == 0  # nothing outside the target's top-k
    stat = float(((obs - p * SAMPLES) ** 2 / (p * SAMPLES)).sum())
    df = TOP_K - 1
    z = 3.719  # upper 1e-4 quantile of N(0, 1); Wilson-Hilferty critical value
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, critical


def sampled_draft(eng: Engine):
    """A perturbed copy of the target, restricted to half of the target's top-k tokens (so
    that both acceptance and the residual carry mass)."""
    model = copy.deepcopy(eng.target.model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for prm in model.parameters():
            prm.add_(torch.randn(prm.shape, generator=gen) * 0.05)
        top = torch.topk(eng.target.model(input_ids=torch.tensor([PROMPT])).logits[0, -1], TOP_K)
    keep = top.indices[::2].tolist() + list(range(100, 140))
    return wrap_fast(model, TOKENIZER, draft_vocab=keep)


def test_sampled_output_has_the_target_distribution_with_a_reduced_head(eng) -> None:
    counts, drafted = first_token_counts(eng, sampled_draft(eng))
    assert drafted > SAMPLES // 2  # the draft did propose
    stat, critical = chi_square_vs_target(eng, counts)
    assert stat < critical, (stat, critical)


def residual_from_p(draft, q, p, gen) -> Verdict:  # type: ignore[no-untyped-def]
    """A broken rule for the negative controls: on rejection, sample from p instead of
    max(0, p - q)."""
    v = verify_sampled(draft, q, p, gen)
    if v.accepted < draft.shape[0]:
        return Verdict(v.accepted, int(torch.multinomial(p[v.accepted], 1, generator=gen)))
    return v


def test_the_chi_square_test_catches_a_residual_that_ignores_q(eng, monkeypatch) -> None:
    """Negative control: on rejection, sample from p instead of max(0, p - q)."""
    monkeypatch.setattr(loop_module, "verify_sampled", residual_from_p)
    counts, _ = first_token_counts(eng, sampled_draft(eng))
    stat, critical = chi_square_vs_target(eng, counts)
    assert stat > critical, (stat, critical)
