"""Rows held out of a step (Batch.step's ``held``: the serving layer's fair steps,
serving/fairness.py `pace`) keep their slots and caches and decode, once stepped again,
exactly what they decode alone: standard, draft-model, prompt-lookup and grammar rows,
held while prefilling or decoding, in a random pattern. A held row whose request was
cancelled ends at once."""

from __future__ import annotations

import random

from gateway.engine import DecodeRequest, DecodeResult, Engine, Finished
from tests.support.batch import PROMPTS, file_results, greedy, mixed_jobs


def test_held_rows_decode_exactly_what_they_decode_alone(llama_lm, draft_lm) -> None:
    engine = Engine(llama_lm)
    jobs = mixed_jobs(engine, draft_lm)
    solo = [engine.run(j.req, j.draft) for j in jobs]
    jobs = mixed_jobs(engine, draft_lm)  # fresh grammars
    pick = random.Random(7)
    batch = engine.batch(8)
    rows: dict[int, int] = {}
    results: dict[int, DecodeResult] = {}
    held_steps = stepped_while_others_held = 0
    step = 0
    while len(results) < len(jobs):
        for i, job in enumerate(jobs):
            if job.join_at == step:
                rows[id(batch.add(engine.prepare(job.req, job.draft)))] = i
        held = [r for r in batch.rows if pick.random() < 0.4]
        held_steps += len(held)
        stepped_while_others_held += bool(held) and len(held) < len(batch.rows)
        stepped = batch.step(held)
        for row, events in stepped:
            assert all(id(row) != id(h) for h in held) or not events, "a held row moved"
        file_results(stepped, rows, results)
        step += 1
        assert step < 4000, "the batch did not finish"
    assert held_steps > 20 and stepped_while_others_held > 10  # the pattern really held rows
    for j, want in enumerate(solo):
        assert results[j].token_ids == want.token_ids, f"row {j} differs after holds"
        assert results[j].finish_reason == want.finish_reason


def test_a_cancelled_held_row_ends_at_once(llama_lm) -> None:
    engine = Engine(llama_lm)
    batch = engine.batch(2)
    gone = [False]
    a = batch.add(engine.prepare(DecodeRequest(PROMPTS[0], greedy(50))), lambda: gone[0])
    b = batch.add(engine.prepare(DecodeRequest(PROMPTS[1], greedy(50))))
    batch.step()
    gone[0] = True
    out = dict((id(r), ev) for r, ev in batch.step(held=[a]))
    assert isinstance(out[id(a)][-1], Finished)
    assert out[id(a)][-1].result.finish_reason == "cancelled"
    assert batch.rows == [b] and batch.free == 1
