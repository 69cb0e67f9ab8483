"""Kept prompt prefixes (gateway/engine/batch/prefix.py): a request of the same scope whose
prompt begins like a finished one's context prefills only the rest, and decodes what a
fresh prefill decodes; another scope, or none, never reuses anything.

Each case compares token ids with the request decoded alone (Engine.run, its own cache):
a prefix lent from the wrong positions, the wrong slot or another prompt changes the
logits of tiny random models well past any near tie."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from gateway.engine import DecodeRequest, DecodeResult, Engine, LoadedModel, SamplingParams
from gateway.engine.batch.prefix import MIN_REUSE, PrefixCache, _common
from gateway.engine.batch.scheduler import Batch
from gateway.engine.batch.slots import SlotCache
from gateway.engine.models import cache_kwarg
from gateway.engine.schema import Finished
from tests.support.batch import Job, drive

A = tuple(range(5, 35))  # 30 tokens
B = tuple(range(40, 70))
C = tuple(range(80, 106))
SHARED = tuple(range(110, 134))  # 24 tokens, then two endings
FIRST, SECOND = (*SHARED, 3, 4, 5, 6), (*SHARED, 7, 8, 9)


def greedy(n: int = 10) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n)


def req(prompt: tuple[int, ...], scope: str | None = "t", n: int = 10, **kw) -> DecodeRequest:  # type: ignore[no-untyped-def]
    return DecodeRequest(prompt, greedy(n), cache_scope=scope, **kw)


def one(batch: Batch, engine: Engine, r: DecodeRequest, draft=None) -> DecodeResult:  # type: ignore[no-untyped-def]
    return drive(batch, engine, [Job(0, r, draft)])[0]


@pytest.fixture
def engine(llama_lm: LoadedModel) -> Engine:
    return Engine(llama_lm)


def test_a_repeated_prompt_prefills_only_its_last_token(engine) -> None:
    batch = engine.batch(4)
    first = one(batch, engine, req(A))
    forwards = batch.forwards
    again = one(batch, engine, req(A))
    assert first.stats.cached_prompt_tokens == 0
    assert again.stats.cached_prompt_tokens == len(A) - 1
    assert again.stats.prefill_s == 0  # no prefill forward ran for it
    assert batch.forwards - forwards == again.stats.target_forwards == len(again.token_ids)
    alone = engine.run(req(A)).token_ids
    assert first.token_ids == again.token_ids == alone


def test_another_scope_or_none_reuses_nothing(engine) -> None:
    batch = engine.batch(4)
    one(batch, engine, req(A, scope="t1"))
    other = one(batch, engine, req(A, scope="t2"))
    unscoped = one(batch, engine, req(A, scope=None))
    assert other.stats.cached_prompt_tokens == 0
    assert unscoped.stats.cached_prompt_tokens == 0
    assert one(batch, engine, req(A, scope="t2")).stats.cached_prompt_tokens == len(A) - 1
    # a request without a scope leaves nothing behind either
    fresh = engine.batch(4)
    one(fresh, engine, req(B, scope=None))
    assert not fresh.prefixes.kept


def test_a_shared_beginning_is_reused_up_to_where_the_prompts_part(engine) -> None:
    batch = engine.batch(4)
    one(batch, engine, req(FIRST))
    got = one(batch, engine, req(SECOND))
    assert got.stats.cached_prompt_tokens == len(SHARED)
    assert got.token_ids == engine.run(req(SECOND)).token_ids


def test_a_chat_continuation_reuses_the_previous_output(engine) -> None:
    """The next turn's prompt is the last prompt, its output and more: the kept context
    covers the output too (its keys came from decode steps, not a prefill)."""
    batch = engine.batch(4)
    turn = one(batch, engine, req(A, n=12))
    follow = (*A, *turn.token_ids, 9, 10, 11)
    got = one(batch, engine, req(follow))
    # kept: the context minus its last token, whose keys the last step never computed
    assert got.stats.cached_prompt_tokens == len(A) + len(turn.token_ids) - 1
    assert got.token_ids == engine.run(req(follow)).token_ids


def test_prefixes_survive_other_prompts_and_rows_moving(engine) -> None:
    """One client alternating prompts (the lowest free slot is always taken: its prefix
    must move aside first), and a row finishing while a later one runs (the later row
    moves into its slot: the finished row's prefix must be copied out first)."""
    batch = engine.batch(4)
    for p in (A, B, C):
        one(batch, engine, req(p))
    for p in (A, B, C):
        got = one(batch, engine, req(p))
        assert got.stats.cached_prompt_tokens == len(p) - 1, p
        assert got.token_ids == engine.run(req(p)).token_ids
    crowd = engine.batch(4)
    drive(crowd, engine, [Job(0, req(FIRST, n=3)), Job(0, req(B, n=12))])  # FIRST leaves first
    assert sorted(len(k.tokens) for k in crowd.prefixes.kept.values())[-1] >= len(B)
    got = one(crowd, engine, req(FIRST))
    assert got.stats.cached_prompt_tokens == len(FIRST) - 1
    assert got.token_ids == engine.run(req(FIRST)).token_ids


def fresh_kv(lm: LoadedModel, tokens: tuple[int, ...]) -> list[tuple[torch.Tensor, ...]]:
    """Every layer's keys and values of `tokens` from the model's own forward."""
    cache = DynamicCache()
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([tokens]), use_cache=True, **{cache_kwarg(lm.model): cache})
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


def assert_notes_hold_their_tokens(prefixes: PrefixCache, lm: LoadedModel) -> None:
    """Each note's slot holds its tokens' keys and values (what a fresh forward computes),
    so a prefix lent from it, copied or in place, is the right one."""
    keys, values = prefixes.cache.buffers()
    assert prefixes.kept
    for slot, note in prefixes.kept.items():
        assert slot in prefixes.cache.free
        n = len(note.tokens)
        for layer, (k, v) in enumerate(fresh_kv(lm, note.tokens)):
            torch.testing.assert_close(keys[layer][slot, :, :n], k, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(values[layer][slot, :, :n], v, atol=1e-4, rtol=1e-4)


def test_every_note_holds_its_tokens_keys_and_values(engine, draft_lm) -> None:
    """After prompts alternate, rows move and drafts leave, in the target's slots and the
    draft's: a copy one token short, or into the wrong slot, fails here."""
    batch = engine.batch(4)
    spec = {"mode": "speculative", "proposer": "draft", "k_max": 4}
    for p in (A, B, C, A):
        one(batch, engine, req(p, **spec), draft_lm)
    drive(batch, engine, [Job(0, req(FIRST, n=3, **spec), draft_lm), Job(0, req(B, n=12))])
    assert_notes_hold_their_tokens(batch.prefixes, engine.target)
    (drafts,) = batch.drafts.values()
    assert_notes_hold_their_tokens(drafts.prefixes, draft_lm)


def test_a_speculative_row_on_a_reused_prefix_gives_the_standard_output(engine, draft_lm) -> None:
    batch = engine.batch(4)
    standard = one(batch, engine, req(A, n=16))
    spec = one(batch, engine, req(A, n=16, mode="speculative", proposer="draft", k_max=4), draft_lm)
    assert spec.stats.cached_prompt_tokens == len(A) - 1
    assert spec.stats.drafted > 0
    assert spec.token_ids == standard.token_ids


def test_a_draft_slot_keeps_its_prefix_too(engine, draft_lm) -> None:
    """The draft's own slots keep what they held, per scope: a repeated speculative prompt
    starts with the draft's prompt in place, not a catch-up forward over all of it."""
    batch = engine.batch(4)
    spec = {"mode": "speculative", "proposer": "draft", "k_max": 4}
    first = one(batch, engine, req(A, n=16, **spec), draft_lm)
    other = batch.add(engine.prepare(req(A, scope="t2", n=16, **spec), draft_lm))
    again = batch.add(engine.prepare(req(A, n=16, **spec), draft_lm))
    assert other.cfg.proposer.fed == 0
    assert again.cfg.proposer.fed == len(A) - 1
    results = {}
    while len(results) < 2:
        for row, events in batch.step():
            results.update({id(row): e.result for e in events if isinstance(e, Finished)})
    standard = engine.run(req(A, n=16)).token_ids
    assert first.token_ids == results[id(again)].token_ids == standard
    assert results[id(other)].token_ids == standard
    assert results[id(again)].stats.drafted > 0


def test_the_least_recently_used_prefix_goes_first() -> None:
    cache = SlotCache(layers=1, slots=4, capacity=64)
    cache._buffers = ([torch.zeros(4, 1, 64, 2)], [torch.zeros(4, 1, 64, 2)])  # allocated
    prefixes = PrefixCache(cache, min_reuse=2)
    for _ in range(4):
        cache.take()
    kept = {3: (7, 8, 9), 2: (10, 11, 12), 1: (4, 5, 6), 0: (1, 2, 3)}  # oldest first
    for slot, tokens in kept.items():
        cache.release(slot)
        prefixes.keep(slot, "t", tokens)
    slot = cache.take()
    assert slot == 0
    assert prefixes.place(slot, "t", (4, 5, 6, 0)) == 3  # slot 1's prefix, copied in
    # slot 0's own prefix had to move aside: over slot 3's, the least recently kept
    assert {k.tokens for k in prefixes.kept.values()} == {(1, 2, 3), (4, 5, 6), (10, 11, 12)}
    assert prefixes.kept[3].tokens == (1, 2, 3)


def test_common_prefix_lengths() -> None:
    assert _common((1, 2, 3), (1, 2, 3, 4), 10) == 3
    assert _common((1, 2, 3), (1, 2, 3, 4), 2) == 2
    assert _common((1, 9, 3), (1, 2, 3), 3) == 1
    assert _common((), (1,), 3) == 0
    assert MIN_REUSE >= 1


def test_a_failed_lend_leaves_the_slot_free(engine, monkeypatch) -> None:
    batch = engine.batch(2)
    one(batch, engine, req(A))

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("copy failed")

    monkeypatch.setattr(batch.prefixes, "place", broken)
    with pytest.raises(RuntimeError):
        batch.add(engine.prepare(req(A)))
    assert batch.cache.in_use == 0 and not batch.rows
