"""Parked rows (Batch.park / Batch.resume: the serving layer's preemption of a tenant over
its share of the rows, serving/fairness.py) leave their slot to another row and, once
resumed, decode exactly what they decode alone: standard, draft-model, prompt-lookup and
grammar rows, parked while prefilling or decoding, in a random pattern, in a batch with
fewer slots than rows. The negative control resumes rows with their keys and values lost:
the same pattern then changes what they decode."""

from __future__ import annotations

import random

import pytest
import torch

from gateway.engine import DecodeResult, Engine, Finished, Parked
from gateway.engine.batch.slots import Saved
from tests.support.batch import Job, file_results, mixed_jobs


def _drive_parking(
    engine: Engine, jobs: list[Job], lose_kv: bool
) -> tuple[dict[int, DecodeResult], int, int]:
    """Three slots for six jobs: each step, now and then a row is parked (its slot then
    takes a waiting job or a parked row); parked rows resume in turn."""
    pick = random.Random(11)
    batch = engine.batch(3, prefill_chunk=4)  # a 12-token prompt prefills in 3 steps
    waiting = list(range(len(jobs)))
    parked: list[tuple[int, Parked]] = []
    rows: dict[int, int] = {}
    results: dict[int, DecodeResult] = {}
    parks = step = prefilling = 0
    while len(results) < len(jobs):
        if batch.rows and pick.random() < 0.4 and len(parked) < 3:
            row = pick.choice(batch.rows)
            prefilling += row.prefilling
            p = batch.park(row)
            if lose_kv:
                zero = [torch.zeros_like(t) for t in p.saved.keys]
                p = Parked(p.row, Saved(p.saved.length, zero, [t.clone() for t in zero]))
            parked.append((rows.pop(id(row)), p))
            parks += 1
        while batch.free and (parked or waiting):
            if parked and (not waiting or pick.random() < 0.5):
                i, p = parked.pop(0)
                rows[id(batch.resume(p))] = i
            else:
                i = waiting.pop(0)
                job = jobs[i]
                rows[id(batch.add(engine.prepare(job.req, job.draft)))] = i
        file_results(batch.step(), rows, results)
        step += 1
        assert step < 4000, "the batch did not finish"
    return results, parks, prefilling


def test_parked_rows_decode_exactly_what_they_decode_alone(llama_lm, draft_lm) -> None:
    engine = Engine(llama_lm)
    solo = [engine.run(j.req, j.draft) for j in mixed_jobs(engine, draft_lm)]
    results, parks, prefilling = _drive_parking(engine, mixed_jobs(engine, draft_lm), False)
    assert parks >= 8 and prefilling >= 1  # the pattern really parked rows, one mid-prompt
    for j, want in enumerate(solo):
        assert results[j].token_ids == want.token_ids, f"row {j} differs after parking"
        assert results[j].finish_reason == want.finish_reason


def test_control_rows_resumed_without_their_keys_and_values_decode_otherwise(
    llama_lm, draft_lm
) -> None:
    engine = Engine(llama_lm)
    solo = [engine.run(j.req, j.draft) for j in mixed_jobs(engine, draft_lm)]
    results, _, _ = _drive_parking(engine, mixed_jobs(engine, draft_lm), lose_kv=True)
    assert any(results[j].token_ids != want.token_ids for j, want in enumerate(solo))


def test_a_full_batch_refuses_a_resume_and_keeps_the_row_parked(llama_lm) -> None:
    engine = Engine(llama_lm)
    jobs = mixed_jobs(engine, llama_lm)[:3]
    batch = engine.batch(1)
    row = batch.add(engine.prepare(jobs[0].req))
    batch.step()
    parked = batch.park(row)
    assert parked.nbytes > 0 and batch.free == 1
    batch.add(engine.prepare(jobs[2].req))
    with pytest.raises(IndexError):
        batch.resume(parked)
    with pytest.raises(ValueError):
        batch.park(row)  # not in the batch any more


def test_a_row_resumes_exactly_in_a_batch_made_anew(llama_lm) -> None:
    """A batch whose forward failed is made anew; a row parked from the old one resumes in
    the new one before any forward there has built its buffers."""
    engine = Engine(llama_lm)
    job = mixed_jobs(engine, llama_lm)[0]
    want = engine.run(job.req).token_ids
    old = engine.batch(2)
    row = old.add(engine.prepare(job.req))
    for _ in range(5):
        old.step()
    parked = old.park(row)
    fresh = engine.batch(2)
    assert not fresh.cache.allocated
    fresh.resume(parked)
    got: list[int] = []
    while not got:
        for _, events in fresh.step():
            got += [t for e in events if isinstance(e, Finished) for t in e.result.token_ids]
    assert got == list(want)
