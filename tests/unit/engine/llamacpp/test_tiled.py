# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""Prompts on ggml's tiled K-quant products, decode and verify steps on its one-token
kernels (backends/llamacpp_calls.py), on a model whose weights the tiled products serve
(`deep_q4`, Q4_K_M 256 wide, three layers).

- A prompt's keys and values are the same whatever its chunking and whatever rows share its
  forwards: the logits of the decode steps after it are equal bit for bit (the negative
  control: without padding a short part to 8 tokens, they are not).
- The tiled products do serve prompts: a prompt fed as decode steps gives other keys and
  values (else the kernels' speed would not be had).
- Through the engine: greedy speculative decoding (verify forwards of up to 9 tokens) gives
  standard decoding's tokens, and rows of a batch (prompts of 2 to 130 tokens, joining at
  different steps) their alone tokens and logprobs, exactly.
- A kept prefix lends only what prompt forwards wrote: a chat's next turn, whose prompt holds
  the last answer, prefills that answer again and decodes as it does alone (the negative
  control: lending the answer's keys and values too, its logprobs differ).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .conftest import needs_llama_cpp

needs_llama_cpp()

from gateway.engine import DecodeRequest, DecodeResult, Engine, LoadedModel, SamplingParams
from gateway.engine.backends import llamacpp_calls
from gateway.engine.backends.llamacpp import LlamaCppCache, load_gguf
from tests.support.batch import Job, drive, greedy

TOKENS = [3 + (7 * i) % 250 for i in range(100)]
MORE = list(range(50, 62))
CHUNKINGS = ([63, 37], [37, 63], [1] * 100, [5] * 20, [8] * 12 + [4], [13] * 7 + [9], [3, 37, 60])


@pytest.fixture(scope="module")
def wide(deep_q4: Path) -> LoadedModel:
    lm = load_gguf(deep_q4, deep_q4.parent, threads=1)
    assert lm.model.tiled
    return lm


def after_prompt(lm: LoadedModel, chunking: list[int], beside: bool, prompt: bool = True):
    """The logits of MORE fed one token a step after TOKENS fed in `chunking`'s chunks as
    prompt forwards (`prompt`) or decode forwards; `beside`: another row's prompt chunks in
    the same forwards."""
    cache = lm.model.slot_cache(2, 256)
    row, other = cache.take(), cache.take()
    at = 0
    for n in chunking:
        slots, feeds = [row], [TOKENS[at : at + n]]
        if beside:
            slots.append(other)
            feeds.append([200 + (at + i) % 40 for i in range(n + at % 2)])
        cache.forward(slots, feeds, keep_last=True, prompt=prompt)
        for s, f in zip(slots, feeds, strict=True):
            cache.length[s] += len(f)
        at += n
    return decode_more(cache, row)


def chunking_gap(lm: LoadedModel) -> float:
    want = after_prompt(lm, [63, 37], beside=False)
    gaps = [
        float((after_prompt(lm, c, b) - want).abs().max()) for c in CHUNKINGS for b in (False, True)
    ]
    return max(gaps)


def test_a_prompts_keys_and_values_do_not_depend_on_its_chunking(wide) -> None:
    assert chunking_gap(wide) == 0.0


def test_control_without_padding_short_parts_they_do(wide, monkeypatch) -> None:
    monkeypatch.setattr(llamacpp_calls, "PROMPT_MIN", 1)
    assert chunking_gap(wide) > 1e-3


def test_prompts_take_the_tiled_products(wide) -> None:
    tiled = after_prompt(wide, [63, 37], beside=False)
    one_token = after_prompt(wide, [1] * 100, beside=False, prompt=False)
    assert float((tiled - one_token).abs().max()) > 1e-3


def alone(engine: Engine, req: DecodeRequest, draft: LoadedModel | None = None) -> DecodeResult:
    return drive(engine.batch(1), engine, [Job(0, req, draft)])[0]


PROMPTS = [tuple(TOKENS[:n]) for n in (2, 5, 9, 40, 70)] + [tuple(TOKENS + TOKENS[:30])]
SPEC = {"mode": "speculative", "k_min": 1, "k_max": 8}


def with_logprobs(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, logprobs=True, top_logprobs=2)


@pytest.mark.parametrize("proposer", ["self", "prompt_lookup"])
def test_greedy_speculative_equals_standard(wide, proposer) -> None:
    engine = Engine(wide)
    draft = wide if proposer == "self" else None
    name = "draft" if proposer == "self" else "prompt_lookup"
    accepted = 0
    for prompt in PROMPTS:
        std = alone(engine, DecodeRequest(prompt, greedy(24)))
        spec = alone(engine, DecodeRequest(prompt, greedy(24), proposer=name, **SPEC), draft)
        assert spec.token_ids == std.token_ids, (proposer, len(prompt))
        accepted += spec.stats.accepted
    assert accepted > 0


def test_forwards_are_cut_into_calls_of_one_kind_of_kernel() -> None:
    """Decode and verify forwards: calls of at most 7 tokens, rows of one length together;
    prompt forwards: a call per row's part, parts as even as they go, a short one padded to
    8 with its last token."""
    calls = llamacpp_calls.plan([0, 1], [10, 20], [[1] * 9, [2] * 3], [9, 1], False, 7)
    assert [len(c) for c in calls] == [5, 4, 3]
    assert [c.owners for c in calls] == [[(0, 5)], [(0, 4)], [(1, 1)]]
    assert list(calls[1].pos) == list(range(15, 19))
    eight = llamacpp_calls.plan(list(range(8)), [0] * 8, [[5]] * 8, [1] * 8, False, 7)
    assert [len(c) for c in eight] == [4, 4]
    calls = llamacpp_calls.plan([1, 0], [4, 0], [[7, 8, 9], [1] * 70], [1, 1], True, 7)
    assert [len(c) for c in calls] == [35, 35, 8]  # slot 0's 70 tokens in even parts
    assert calls[1].ends == [(1, 70)] and list(calls[1].outs)[-1] == 1
    assert list(calls[2].ids) == [7, 8, 9] + [9] * 5 and list(calls[2].outs) == [0, 0, 1] + [0] * 5
    assert calls[2].ends == [(0, 7), (0, 12)]


def test_rows_of_a_batch_give_their_alone_tokens_and_logprobs(wide) -> None:
    engine = Engine(wide)
    jobs = [
        Job(i % 3, DecodeRequest(p, with_logprobs(16), **(SPEC if i % 2 else {})),
            wide if i % 2 else None)
        for i, p in enumerate(PROMPTS + PROMPTS[::-1][:2])
    ]  # fmt: skip
    together = drive(engine.batch(8), engine, jobs)
    for job, got in zip(jobs, together, strict=True):
        want = alone(engine, job.req, job.draft)
        assert got.token_ids == want.token_ids, len(job.req.prompt_ids)
        assert [x.logprob for x in got.logprobs] == [x.logprob for x in want.logprobs]


def next_turn(lm: LoadedModel) -> tuple[DecodeResult, DecodeResult]:
    """A request, then the next turn (its prompt: the first's prompt, its answer and more)
    in the same batch, keeping prefixes; and that turn alone in a fresh batch."""
    engine = Engine(lm)
    first = DecodeRequest(PROMPTS[3], greedy(20), cache_scope="tenant")
    batch = engine.batch(2)
    answer = drive(batch, engine, [Job(0, first)])[0].token_ids
    prompt = (*PROMPTS[3], *answer, *TOKENS[60:70])
    turn = DecodeRequest(prompt, with_logprobs(12), cache_scope="tenant")
    return drive(batch, engine, [Job(0, turn)])[0], alone(engine, turn)


def test_a_kept_prefix_lends_only_the_prompts_keys_and_values(wide) -> None:
    kept, fresh = next_turn(wide)
    assert kept.stats.cached_prompt_tokens == len(PROMPTS[3]) - 1
    assert kept.token_ids == fresh.token_ids
    assert [x.logprob for x in kept.logprobs] == [x.logprob for x in fresh.logprobs]


def test_control_lending_the_answer_too_lends_decode_steps_keys_and_values(
    wide, monkeypatch
) -> None:
    """Without the cache's limit the answer's positions are lent too, and keys and values
    written by decode steps are not a prompt's: a turn after them decodes other logits
    than after a fresh prefill (here measured on the cache, for the same tokens)."""
    monkeypatch.setattr(LlamaCppCache, "reusable", lambda self, slot, n: n)
    kept, _ = next_turn(wide)
    assert kept.stats.cached_prompt_tokens > len(PROMPTS[3])
    lent = after_layout(wide, [(39, True), (20, False), (10, True)])
    fresh = after_layout(wide, [(69, True)])
    assert float((lent - fresh).abs().max()) > 1e-3


def after_layout(lm: LoadedModel, layout: list[tuple[int, bool]]) -> torch.Tensor:
    """The logits of MORE after TOKENS[:69] fed as `layout`: (count, as a prompt forward,
    else one decode step a token)."""
    cache = lm.model.slot_cache(1, 256)
    row = cache.take()
    at = 0
    for n, prompt in layout:
        for part in [TOKENS[at : at + n]] if prompt else [[t] for t in TOKENS[at : at + n]]:
            cache.forward([row], [part], keep_last=True, prompt=prompt)
            cache.length[row] += len(part)
        at += n
    return decode_more(cache, row)


def test_the_prompt_part_follows_a_slot_through_copies_and_parking(wide) -> None:
    cache = wide.model.slot_cache(3, 256)
    a, b, c = cache.take(), cache.take(), cache.take()
    cache.forward([a], [TOKENS[:30]], keep_last=True, prompt=True)
    cache.length[a] = 30
    cache.forward([a], [TOKENS[30:35]], keep_last=True)
    cache.length[a] = 35
    assert cache.reusable(a, 35) == 30 and cache.reusable(a, 20) == 20
    cache.copy_prefix(a, b, 33)
    assert cache.reusable(b, 33) == 30
    saved = cache.save(a)
    cache.restore(c, saved)
    assert cache.reusable(c, 35) == 30
    cache.length[c] = 25  # a rollback below the prompt's end
    cache.forward([c], [[5]], keep_last=True)
    assert cache.reusable(c, 26) == 25


def decode_more(cache, row: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The logits of MORE fed one token a step after the row's prompt."""
    out = []
    for t in MORE:
        out.append(cache.forward([row], [[t]], keep_last=False)[0])
        cache.length[row] += 1
    return torch.cat(out)
