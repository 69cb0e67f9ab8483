"""Continuous batching: a request's output does not depend on who else is in the batch.

Every request decodes alone (Engine.run, its own DynamicCache) and inside mixed batches:
other prompt lengths, standard and speculative neighbours (draft model, prompt lookup),
a grammar-constrained neighbour, neighbours joining and leaving at different steps, on
Llama, Qwen2, Mistral and GPT-2 targets. Greedy rows must give the same tokens; a seeded
sampled row the same tokens too (its generator, k and arithmetic are its own). The batch's
one shared forward rounds like the single forward up to ~1e-7 (fp32), so a parting could
only come at an exact near-tie; tiny random models have none at these lengths.
"""

from __future__ import annotations

import pytest
import torch

from gateway.engine import (
    DecodeRequest,
    Engine,
    LoadedModel,
    SamplingParams,
    TokenSequencesGrammar,
)
from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.batch.slots import SlotCache
from gateway.engine.schema import Finished
from gateway.speed import wrap_fast
from tests.support.batch import (
    PROMPTS,
    Job,
    draft_jobs,
    drive,
    greedy,
    mistral,
    mixed_jobs,
    qwen2,
    run_batch,
)
from tests.support.models import CONTEXT


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral", "gpt2"])
def target(request, llama_lm, gpt2_lm, tokenizer) -> LoadedModel:
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    if request.param == "llama":
        return llama_lm
    if request.param == "gpt2":
        return gpt2_lm
    build = qwen2 if request.param == "qwen2" else mistral
    return wrap_fast(build(vocab, eos).eval(), tokenizer)


def test_a_mixed_batch_gives_every_row_its_alone_output(target, draft_lm) -> None:
    engine = Engine(target)
    solo = [engine.run(j.req, j.draft) for j in mixed_jobs(engine, draft_lm)]
    batched = run_batch(engine, mixed_jobs(engine, draft_lm))  # fresh grammars
    for j, (a, b) in enumerate(zip(solo, batched, strict=True)):
        assert b.token_ids == a.token_ids, f"row {j} differs in the batch"
        assert b.finish_reason == a.finish_reason
    assert any(r.stats.drafted for r in batched)  # speculation really ran inside the batch


def test_batch_of_one_and_any_company_agree(llama_lm, draft_lm) -> None:
    engine = Engine(llama_lm)
    req = DecodeRequest(PROMPTS[2], greedy(24), mode="speculative", proposer="draft")
    one = run_batch(engine, [Job(0, req, draft_lm)], max_rows=1)[0]
    crowd = [Job(0, DecodeRequest(p, greedy(10 + 3 * i))) for i, p in enumerate(PROMPTS)]
    many = run_batch(engine, [*crowd, Job(2, req, draft_lm)])[-1]
    assert one.token_ids == many.token_ids == engine.run(req, draft_lm).token_ids


def test_a_seeded_sampled_row_keeps_its_text_in_any_company(llama_lm, draft_lm) -> None:
    engine = Engine(llama_lm)
    sp = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=24, seed=123)
    req = DecodeRequest(PROMPTS[0], sp, mode="speculative", proposer="draft")
    want = engine.run(req, draft_lm).token_ids
    noisy = SamplingParams(temperature=1.0, max_tokens=30)  # unseeded neighbours
    company = [Job(0, DecodeRequest(p, noisy, mode="speculative", proposer="draft"), draft_lm)
               for p in PROMPTS]  # fmt: skip
    got = run_batch(engine, [*company, Job(1, req, draft_lm)])[-1]
    assert got.token_ids == want


def test_cancel_frees_the_slot_and_a_full_batch_refuses(llama_lm) -> None:
    engine = Engine(llama_lm)
    batch = engine.batch(2)
    a = batch.add(engine.prepare(DecodeRequest(PROMPTS[0], greedy(50))))
    batch.add(engine.prepare(DecodeRequest(PROMPTS[1], greedy(50))))
    with pytest.raises(IndexError):
        batch.add(engine.prepare(DecodeRequest(PROMPTS[2], greedy(5))))
    batch.step()
    batch.cancel(a)
    assert batch.free == 1
    batch.add(engine.prepare(DecodeRequest(PROMPTS[2], greedy(5))))  # the freed slot


def test_rows_stay_packed_in_the_lowest_slots_and_a_moved_row_decodes_as_alone(
    llama_lm, draft_lm
) -> None:
    """A row that leaves hands its slot to the row in the highest slot, whose keys and
    values move with it (SlotCache.move), so that the rows keep slots 0..n-1 (what a
    compiled verify step reads as one view); the moved rows, one of them speculative,
    decode what they decode alone."""
    engine = Engine(llama_lm)
    reqs = [
        DecodeRequest(PROMPTS[0], greedy(3)),
        DecodeRequest(PROMPTS[1], greedy(6)),
        DecodeRequest(PROMPTS[2], greedy(30)),
        DecodeRequest(PROMPTS[3], greedy(30), mode="speculative", proposer="draft"),
    ]
    drafts = [None, None, None, draft_lm]
    alone = [engine.run(r, d).token_ids for r, d in zip(reqs, drafts, strict=True)]
    batch = engine.batch(4)
    rows = [batch.add(engine.prepare(r, d)) for r, d in zip(reqs, drafts, strict=True)]
    assert [r.slot for r in rows] == [0, 1, 2, 3]
    got: dict[int, tuple[int, ...]] = {}
    moved = False
    while len(got) < len(rows):
        for row, events in batch.step():
            for e in events:
                if isinstance(e, Finished):
                    got[rows.index(row)] = e.result.token_ids
        live = sorted(r.slot for r in batch.rows)
        assert live == list(range(len(batch.rows)))  # packed after every departure
        moved |= any(r.slot != i for i, r in enumerate(rows) if r in batch.rows)
    assert moved  # a row really changed slot while decoding
    assert [got[i] for i in range(len(rows))] == alone
    batch.add(engine.prepare(DecodeRequest(PROMPTS[0], greedy(2))))
    assert [r.slot for r in batch.rows] == [0]  # the lowest free slot


def test_a_cancelled_callback_ends_the_row_with_cancelled(llama_lm) -> None:
    engine = Engine(llama_lm)
    batch = engine.batch(2)
    stop = {"now": False}
    batch.add(engine.prepare(DecodeRequest(PROMPTS[0], greedy(50))), lambda: stop["now"])
    batch.step()
    stop["now"] = True
    (_, events), *_ = batch.step()
    assert isinstance(events[-1], Finished) and events[-1].result.finish_reason == "cancelled"
    assert batch.free == 2


def test_a_long_prompt_is_prefilled_in_chunks(llama_lm) -> None:
    """An arrival's prompt enters the cache one chunk per step, and decodes the same."""
    engine = Engine(llama_lm)
    prompt = tuple((i * 7) % 200 + 3 for i in range(60))
    batch = engine.batch(2, prefill_chunk=16)  # GATEWAY_PREFILL_CHUNK
    row = batch.add(engine.prepare(DecodeRequest(prompt, greedy(6))))
    for _ in range(3):
        batch.step()
        assert row.prefilling  # 16, 32, 48 of 59 tokens
    results = run_batch(engine, [Job(0, DecodeRequest(prompt, greedy(6)))])
    assert results[0].token_ids == engine.run(DecodeRequest(prompt, greedy(6))).token_ids
    with pytest.raises(ValueError, match="at least one token"):
        engine.batch(2, prefill_chunk=0)


@pytest.mark.parametrize(("fed", "steps"), [(20, 1), (21, 2), (36, 2), (37, 3)])
def test_a_lone_rows_short_rest_joins_its_last_chunk(llama_lm, fed, steps) -> None:
    """A row prefilling alone takes a rest of up to a quarter chunk (4 of 16) with its
    chunk instead of a forward of its own, and decodes the same."""
    engine = Engine(llama_lm)
    prompt = tuple((i * 7) % 200 + 3 for i in range(fed + 1))  # all but the last token fed
    batch = engine.batch(2, prefill_chunk=16)
    row = batch.add(engine.prepare(DecodeRequest(prompt, greedy(4))))
    for _ in range(steps):
        assert row.prefilling
        batch.step()
    assert not row.prefilling and row.prefilled == fed
    results = run_batch(engine, [Job(0, DecodeRequest(prompt, greedy(4)))])
    assert results[0].token_ids == engine.run(DecodeRequest(prompt, greedy(4))).token_ids


@pytest.mark.parametrize(("budget", "prefilled"), [(64, 4), (32, 2), (16, 1)])
def test_arrivals_prefill_together_within_the_budget(llama_lm, budget, prefilled) -> None:
    """Rows arriving together feed their chunks in one prefill forward, as many as fit the
    budget (GATEWAY_PREFILL_BUDGET: rows x chunk), and decode what they decode alone."""
    engine = Engine(llama_lm)
    prompts = [tuple((i * 7 + r) % 200 + 3 for i in range(17)) for r in range(4)]  # 16 + 1
    batch = engine.batch(4, prefill_chunk=16, prefill_budget=budget)
    rows = [batch.add(engine.prepare(DecodeRequest(p, greedy(5)))) for p in prompts]
    batch.step()
    assert [r.prefilling for r in rows] == [False] * prefilled + [True] * (4 - prefilled)
    jobs = [Job(0, DecodeRequest(p, greedy(5))) for p in prompts]
    got = drive(engine.batch(4, prefill_chunk=16, prefill_budget=budget), engine, jobs)
    for p, r in zip(prompts, got, strict=True):
        assert r.token_ids == engine.run(DecodeRequest(p, greedy(5))).token_ids


def test_the_shared_forward_matches_single_forwards(target) -> None:
    """Rows of different lengths, one of them feeding fewer tokens, in one forward."""
    model = target.model
    seqs = [list(p) for p in PROMPTS if len(p) > 2]
    cache = SlotCache(int(model.config.num_hidden_layers), 4, CONTEXT)
    slots = [cache.take() for _ in seqs]
    with torch.inference_mode():
        for s, seq in zip(slots, seqs, strict=True):
            batched_forward(model, Step(cache, [s], [seq[:-2]]))
            cache.length[s] = len(seq) - 2
        feeds = [seq[-2:] for seq in seqs]
        feeds[1] = feeds[1][:1]
        got = batched_forward(model, Step(cache, slots, feeds))
        for seq, feed, logits in zip(seqs, feeds, got, strict=True):
            full = model(input_ids=torch.tensor([seq[: len(seq) - 2 + len(feed)]])).logits[0]
            torch.testing.assert_close(logits, full[-len(feed) :], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", [False, True], ids=["full_head", "reduced_head"])
def test_draft_rows_share_every_draft_forward_and_draft_what_they_draft_alone(
    llama_lm, draft_lm, tokenizer, head
) -> None:
    """Rows drafting with one draft model run its forwards together, and each drafts and
    has accepted exactly what it drafts alone: its draft KV slot holds its own context."""
    draft = draft_lm
    if head:  # the same draft, drafting among half the vocabulary (batched head path)
        subset = list(range(0, len(tokenizer), 2))
        draft = wrap_fast(draft_lm.model, tokenizer, draft_vocab=subset)
    engine = Engine(llama_lm)
    solo = [engine.run(j.req, j.draft) for j in draft_jobs(draft)]
    batch = engine.batch(8)
    got = drive(batch, engine, draft_jobs(draft))
    for a, b in zip(solo, got, strict=True):
        assert b.token_ids == a.token_ids
        assert (b.stats.drafted, b.stats.accepted) == (a.stats.drafted, a.stats.accepted)
    assert batch.draft_forwards < sum(r.stats.draft_forwards for r in got)
    assert all(not db.members for db in batch.drafts.values())  # every slot was given back


def test_an_idle_draft_cache_serves_the_next_wave_and_goes_when_another_draft_comes(
    llama_lm, draft_lm, tokenizer
) -> None:
    """A draft's slot cache outlives its last row (no new allocation for the next request
    that drafts with it; its stale slots change nothing) and is freed when another draft
    needs a cache."""
    engine = Engine(llama_lm)
    solo = [list(engine.run(j.req, j.draft).token_ids) for j in draft_jobs(draft_lm)]
    batch = engine.batch(8)
    caches = []
    for _wave in range(2):
        assert [list(r.token_ids) for r in drive(batch, engine, draft_jobs(draft_lm))] == solo
        caches.append(batch.drafts[id(draft_lm)].cache)
    assert caches[0] is caches[1]
    other = wrap_fast(draft_lm.model, tokenizer, draft_vocab=list(range(0, len(tokenizer), 2)))
    drive(batch, engine, draft_jobs(other))
    assert list(batch.drafts) == [id(other)]


def test_a_draft_slot_rolls_back_rejections_per_row(llama_lm, draft_lm) -> None:
    """A perfect draft (the target) next to a poor one: rows accept different counts every
    step, so their draft slots part in length; both still draft what they draft alone."""
    engine = Engine(llama_lm)
    spec = {"mode": "speculative", "proposer": "draft", "k_min": 3, "k_max": 3}
    jobs = [
        Job(0, DecodeRequest(PROMPTS[0], greedy(20), **spec), draft_lm),
        Job(0, DecodeRequest(PROMPTS[2], greedy(20), **spec), llama_lm),
        Job(1, DecodeRequest(PROMPTS[3], greedy(20), **spec), draft_lm),
    ]
    solo = [engine.run(j.req, j.draft) for j in jobs]
    got = run_batch(engine, jobs)
    assert solo[1].stats.accepted == solo[1].stats.drafted  # the target drafting for itself
    assert solo[0].stats.accepted < solo[0].stats.drafted
    for a, b in zip(solo, got, strict=True):
        assert (b.token_ids, b.stats.drafted, b.stats.accepted) == (
            a.token_ids, a.stats.drafted, a.stats.accepted,
        )  # fmt: skip


class _Exploding(TokenSequencesGrammar):
    """A grammar whose third consume raises (a bug in one row's constraint)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def consume(self, token: int) -> None:
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("this row's grammar broke")
        super().consume(token)


def test_one_rows_failing_grammar_in_a_shared_draft_ends_only_that_row(llama_lm, draft_lm):
    engine = Engine(llama_lm)
    words = ["def add(a, b):", "return a + b", "for i in"]
    seqs = [engine.tokenizer(w, add_special_tokens=False)["input_ids"] for w in words]
    spec = {"mode": "speculative", "proposer": "draft", "k_min": 4, "k_max": 4}
    ok = DecodeRequest(PROMPTS[0], greedy(16), **spec)
    bad = DecodeRequest(PROMPTS[2], greedy(16), grammar=_Exploding(seqs, True), **spec)
    batch = engine.batch(4)
    good_row = batch.add(engine.prepare(ok, draft_lm))
    bad_row = batch.add(engine.prepare(bad, draft_lm))
    seen: dict[int, list] = {id(good_row): [], id(bad_row): []}
    while batch.rows:
        for row, events in batch.step():
            seen[id(row)] += events
    assert isinstance(seen[id(bad_row)][-1], RuntimeError)
    last = seen[id(good_row)][-1]
    assert isinstance(last, Finished)
    assert last.result.token_ids == engine.run(ok, draft_lm).token_ids


def test_a_fresh_arrival_does_not_prefill_beside_a_long_prompts_late_chunk(llama_lm) -> None:
    """A prefill forward attends every row over its longest row's keys, so rows prefill
    together only when their prompts are as far along (within one chunk); each decodes what
    it decodes alone."""
    engine = Engine(llama_lm)
    long = tuple((i * 7) % 200 + 3 for i in range(60))
    short = [tuple((i * 5 + r) % 200 + 3 for i in range(17)) for r in range(2)]
    batch = engine.batch(3, prefill_chunk=16, prefill_budget=64)
    first = batch.add(engine.prepare(DecodeRequest(long, greedy(4))))
    batch.step()
    batch.step()  # 32 of its 59 tokens in
    late = [batch.add(engine.prepare(DecodeRequest(p, greedy(4)))) for p in short]
    batch.step()
    assert first.prefilled == 48 and all(r.prefilled == 0 for r in late)  # it went alone
    while first.prefilling:
        batch.step()
    batch.step()
    assert not any(r.prefilling for r in late)  # then the two arrivals went together
    jobs = [Job(0, DecodeRequest(long, greedy(4)))] + [
        Job(2, DecodeRequest(p, greedy(4))) for p in short
    ]
    got = drive(engine.batch(3, prefill_chunk=16, prefill_budget=64), engine, jobs)
    for job, r in zip(jobs, got, strict=True):
        assert r.token_ids == engine.run(job.req).token_ids
