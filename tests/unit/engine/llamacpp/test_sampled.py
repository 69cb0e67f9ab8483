# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""Sampled exactness on the llama.cpp backend: a speculative row sharing its target and draft
forwards with neighbours emits the target's distribution, the target's as llama.cpp computes
it (chi-square over the first token, top-k 6); the negative control (a residual sampled
from p instead of max(0, p - q)) fails the same test."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from .conftest import needs_llama_cpp

needs_llama_cpp()

from gateway.engine import DecodeRequest, Engine, LoadedModel, SamplingParams
from gateway.engine import loop as loop_module
from gateway.engine.backends.base import slot_cache
from gateway.engine.backends.llamacpp import load_gguf
from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.schema import Finished
from gateway.engine.verifier import Verdict, verify_sampled
from models_registry.gguf import write_llama
from tests.support.models import build_tokenizer, llama, save

PROMPT = (10, 20, 30, 40, 50)
TOP_K, SAMPLES, ROWS = 6, 3000, 6
NOISE = 0.05  # the draft: the target with this much noise on every weight


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoadedModel, LoadedModel]:
    root: Path = tmp_path_factory.mktemp("sampled")
    tok = build_tokenizer()
    target = llama(len(tok), tok.eos_token_id, seed=6, init=0.3)
    draft = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for prm in draft.parameters():
            prm.add_(torch.randn(prm.shape, generator=gen) * NOISE)
        # Half of the target's top-k nearly out of the draft's reach at the first token (its
        # output rows the negated top token's): acceptance and the residual both carry mass
        top = target(input_ids=torch.tensor([PROMPT])).logits[0, -1].topk(TOP_K).indices
        head = draft.get_output_embeddings().weight
        head[top[1::2]] = -head[top[0]]
    lms = []
    for name, model in (("target", target), ("draft", draft)):
        d = save(model, tok, root / name)
        lms.append(load_gguf(write_llama(d, root / f"{name}.gguf"), d, threads=1))
    return lms[0], lms[1]


def first_token_counts(target: LoadedModel, draft: LoadedModel) -> tuple[torch.Tensor, int]:
    eng = Engine(target)
    counts = torch.zeros(target.vocab_size)
    drafted = 0
    spec = {"mode": "speculative", "proposer": "draft", "k_min": 1, "k_max": 1}
    for start in range(0, SAMPLES, ROWS):
        batch = eng.batch(ROWS + 1)
        mine = set()
        for seed in range(start, min(start + ROWS, SAMPLES)):
            sp = SamplingParams(temperature=1.0, top_k=TOP_K, max_tokens=2, seed=seed)
            mine.add(id(batch.add(eng.prepare(DecodeRequest(PROMPT, sp, **spec), draft))))
        batch.add(eng.prepare(DecodeRequest((9, 8), SamplingParams(max_tokens=4))))  # company
        while batch.rows:
            for row, events in batch.step():
                for e in events:
                    assert not isinstance(e, Exception), e
                    if isinstance(e, Finished) and id(row) in mine:
                        counts[e.result.token_ids[0]] += 1
                        drafted += e.result.stats.drafted
    return counts, drafted


def chi_square(target: LoadedModel, counts: torch.Tensor) -> tuple[float, float]:
    cache = slot_cache(target.model, 1, target.context_length)
    z = batched_forward(target.model, Step(cache, [cache.take()], [list(PROMPT)]))
    top = torch.topk(z[0][-1].double(), TOP_K)
    p = torch.softmax(top.values, -1)
    obs = counts[top.indices].double()
    assert int(counts.sum() - obs.sum()) == 0  # nothing outside the target's top-k
    stat = float(((obs - p * SAMPLES) ** 2 / (p * SAMPLES)).sum())
    df = TOP_K - 1
    z99 = 3.719  # upper 1e-4 quantile of N(0, 1); Wilson-Hilferty critical value
    return stat, df * (1 - 2 / (9 * df) + z99 * math.sqrt(2 / (9 * df))) ** 3


def test_a_row_in_a_batch_samples_the_target_distribution(pair) -> None:
    counts, drafted = first_token_counts(*pair)
    assert drafted > SAMPLES // 2  # the draft did propose
    stat, critical = chi_square(pair[0], counts)
    assert stat < critical, (stat, critical)


def test_the_test_catches_a_residual_that_ignores_q(pair, monkeypatch) -> None:
    def residual_from_p(draft, q, p, gen) -> Verdict:  # type: ignore[no-untyped-def]
        v = verify_sampled(draft, q, p, gen)
        if v.accepted < draft.shape[0]:
            return Verdict(v.accepted, int(torch.multinomial(p[v.accepted], 1, generator=gen)))
        return v

    monkeypatch.setattr(loop_module, "verify_sampled", residual_from_p)
    counts, _ = first_token_counts(*pair)
    stat, critical = chi_square(pair[0], counts)
    assert stat > critical, (stat, critical)
