"""Greedy speculative decoding is token-for-token identical to standard decoding, for every
proposer, over random models (Llama and GPT-2), prompts, k bounds and max_tokens."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.engine import DecodeRequest, Engine, LoadedModel, SamplingParams
from gateway.speed import wrap_fast
from tests.support.models import build_tokenizer, gpt2, llama

TOKENIZER = build_tokenizer()
VOCAB, EOS = len(TOKENIZER), TOKENIZER.eos_token_id


@cache
def target_model(arch: str, seed: int) -> LoadedModel:
    build = llama if arch == "llama" else gpt2
    return wrap_fast(build(VOCAB, EOS, seed=100 + seed, init=0.3), TOKENIZER)


@cache
def draft_model(arch: str, seed: int, noise: float, head: bool = False) -> LoadedModel:
    """noise 0: the target itself; small noise: a perturbed copy (partial acceptance);
    noise < 0: an unrelated random 1-layer Llama. head: draft among every other token id
    only (a reduced output head, draft_head.py)."""
    subset = list(range(0, VOCAB, 2)) if head else None
    if noise < 0:
        model = llama(VOCAB, EOS, seed=500 + seed, layers=1, init=0.3)
        return wrap_fast(model, TOKENIZER, draft_vocab=subset)
    model = copy.deepcopy(target_model(arch, seed).model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise)
    return wrap_fast(model, TOKENIZER, draft_vocab=subset)


@cache
def engine(arch: str, seed: int) -> Engine:
    return Engine(target_model(arch, seed))


prompts = st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=24).map(tuple)


@dataclass(frozen=True)
class Case:
    """One drawn case: the models, the prompt, the proposer and its k bounds."""

    arch: str
    seed: int
    prompt: tuple[int, ...]
    proposer: str
    noise: float
    """The draft model's noise (draft_model)."""
    k_min: int
    k_extra: int
    max_tokens: int
    corrupt: int
    """Which token of the prediction text is wrong (proposer "prediction")."""
    min_conf: float
    head: bool


cases = st.builds(
    Case,
    arch=st.sampled_from(["llama", "gpt2"]),
    seed=st.integers(0, 2),
    prompt=prompts,
    proposer=st.sampled_from(["draft", "prompt_lookup", "prediction"]),
    noise=st.sampled_from([0.0, 0.05, 0.2, -1.0]),
    k_min=st.integers(1, 3),
    k_extra=st.integers(0, 5),
    max_tokens=st.integers(1, 40),
    corrupt=st.integers(0, 30),
    min_conf=st.sampled_from([0.0, 0.0, 0.3, 0.9]),
    head=st.booleans(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=cases)
def test_greedy_speculative_equals_standard(case: Case) -> None:
    eng = engine(case.arch, case.seed)
    sp = SamplingParams(temperature=0.0, max_tokens=case.max_tokens)
    standard = eng.run(DecodeRequest(case.prompt, sp))
    prediction = None
    if case.proposer == "prediction":  # partly right: the true output with one token replaced
        ids = list(standard.token_ids)
        if ids:
            wrong = case.corrupt % len(ids)
            ids[wrong] = (ids[wrong] + 7) % VOCAB
        prediction = TOKENIZER.decode(ids, skip_special_tokens=True) or "x"
    k_min, k_max = case.k_min, case.k_min + case.k_extra
    req = DecodeRequest(
        case.prompt,
        sp,
        mode="speculative",
        proposer=case.proposer,  # type: ignore[arg-type]
        k_min=k_min,
        k_max=k_max,
        prediction=prediction,
        min_draft_confidence=case.min_conf,
    )
    draft = None
    if case.proposer == "draft":
        draft = draft_model(case.arch, case.seed, case.noise, case.head)
    spec = eng.run(req, draft=draft)
    assert spec.token_ids == standard.token_ids
    assert spec.text == standard.text
    assert spec.finish_reason == standard.finish_reason
    s = spec.stats
    assert s.rejected == s.drafted - s.accepted
    assert sum(s.accepted_per_pos) == s.accepted
    assert all(k_min <= k <= k_max or k < k_min for k in s.k_history)
    if case.proposer == "draft" and case.noise == 0.0 and not case.head:
        assert s.accepted == s.drafted  # the target drafting for itself is always right


def test_speculation_saves_target_forwards() -> None:
    """With a perfect draft, tokens per target forward approach k + 1."""
    eng = engine("llama", 0)
    sp = SamplingParams(temperature=0.0, max_tokens=40)
    req = DecodeRequest((5, 6, 7), sp, mode="speculative", proposer="draft", k_min=4, k_max=4)
    res = eng.run(req, draft=draft_model("llama", 0, 0.0))
    assert res.stats.tokens_per_target_forward >= 4.0
    assert res.stats.target_forwards <= 1 + 40 // 5 + 1


def test_low_draft_confidence_ends_the_draft_early() -> None:
    """An unrelated random draft is unsure of every token: with a confidence floor of 0.99
    each proposal stops after its first token; without one it drafts the full k."""
    eng, draft = engine("llama", 1), draft_model("llama", 1, -1.0)
    sp = SamplingParams(temperature=0.0, max_tokens=30)

    def run(min_conf: float):
        req = DecodeRequest(
            (3, 4, 5), sp, mode="speculative", k_min=6, k_max=6, min_draft_confidence=min_conf
        )
        return eng.run(req, draft=draft)

    free, floored = run(0.0), run(0.99)
    assert floored.token_ids == free.token_ids
    assert floored.stats.drafted == len(floored.stats.k_history)  # one token per proposal
    assert free.stats.drafted > 2 * len(free.stats.k_history)
