"""Driving the continuous batch in tests: jobs, a driver that admits them at their steps,
the prompts and the family builders the batch tests share."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from gateway.engine import (
    DecodeRequest,
    DecodeResult,
    Engine,
    LoadedModel,
    SamplingParams,
    TokenSequencesGrammar,
)
from gateway.engine.schema import Finished
from tests.support.models import CONTEXT

PROMPTS = [(10, 20, 30, 40, 50), (7,), (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8), (11, 12, 11, 12, 11)]


def shape(vocab: int, eos: int) -> dict[str, int | float]:
    return {
        "vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": CONTEXT,
        "initializer_range": 0.1, "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos,
    }  # fmt: skip


def qwen2(vocab: int, eos: int) -> Qwen2ForCausalLM:
    torch.manual_seed(4)
    cfg = Qwen2Config(**shape(vocab, eos))
    return Qwen2ForCausalLM(cfg)


def mistral(vocab: int, eos: int) -> MistralForCausalLM:
    torch.manual_seed(5)
    cfg = MistralConfig(**shape(vocab, eos), sliding_window=16)
    return MistralForCausalLM(cfg)


@dataclass
class Job:
    join_at: int  # the batch step before which it joins
    req: DecodeRequest
    draft: LoadedModel | None = None


def drive(batch, engine: Engine, jobs: list[Job]) -> list[DecodeResult]:  # type: ignore[no-untyped-def]
    """Step `batch` until every job (joining at its step) has finished; results in order."""
    rows, results, step = {}, {}, 0
    while len(results) < len(jobs):
        for i, job in enumerate(jobs):
            if job.join_at == step:
                rows[id(batch.add(engine.prepare(job.req, job.draft)))] = i
        file_results(batch.step(), rows, results)
        step += 1
        assert step < 2000, "the batch did not finish"
    return [results[i] for i in range(len(jobs))]


def file_results(stepped, rows: dict[int, int], results: dict[int, DecodeResult]) -> None:  # type: ignore[no-untyped-def]
    """A step's events: no row failed; each finished row's result under its job's index
    (``rows``: id(row) -> index)."""
    for row, events in stepped:
        for e in events:
            assert not isinstance(e, Exception), e
            if isinstance(e, Finished):
                results[rows[id(row)]] = e.result


def run_batch(engine: Engine, jobs: list[Job], max_rows: int = 8) -> list[DecodeResult]:
    batch = engine.batch(max_rows)
    out = drive(batch, engine, jobs)
    if len(jobs) > 1:  # the rows really shared forwards
        assert batch.forwards < sum(r.stats.target_forwards for r in out)
    return out


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n)


def mixed_jobs(engine: Engine, draft: LoadedModel) -> list[Job]:
    words = ["def add(a, b):", "return a + b", "return None", "for i in"]
    seqs = [engine.tokenizer(w, add_special_tokens=False)["input_ids"] for w in words]
    spec = {"mode": "speculative", "k_min": 1, "k_max": 5}
    return [
        Job(0, DecodeRequest(PROMPTS[0], greedy(20))),
        Job(0, DecodeRequest(PROMPTS[1], greedy(30), proposer="draft", **spec), draft),
        Job(1, DecodeRequest(PROMPTS[2], greedy(12), proposer="prompt_lookup", **spec)),
        Job(3, DecodeRequest(PROMPTS[3], greedy(25), grammar=TokenSequencesGrammar(seqs, True))),
        Job(3, DecodeRequest(PROMPTS[0], greedy(8), proposer="draft", **spec), draft),
        Job(9, DecodeRequest(PROMPTS[2], greedy(16))),
    ]


def draft_jobs(draft: LoadedModel, k: int = 4) -> list[Job]:
    spec = {"mode": "speculative", "proposer": "draft", "k_min": k, "k_max": k}
    lengths = [18, 11, 25, 7, 14]
    return [
        Job(i // 2, DecodeRequest(p, greedy(lengths[i]), **spec), draft)
        for i, p in enumerate([*PROMPTS, PROMPTS[2][:7]])
    ]
