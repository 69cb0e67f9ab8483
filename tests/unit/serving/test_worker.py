"""The inference worker: the thread that owns torch runs jobs and calls, in order."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.serving.errors import GatewayError
from gateway.serving.models import ModelPool, PoolOptions
from gateway.serving.worker import InferenceWorker, WorkerOptions
from gateway.speed import load_fast
from models_registry.manifest import load_manifest
from tests.integration import tiny_models
from tests.support.worker import patch_target_forwards, spied_engine, started


def counting(n: int, tag: str) -> Callable[[Callable[[], bool]], Iterator[str]]:
    def make(cancelled: Callable[[], bool]) -> Iterator[str]:
        return (f"{tag}{i}" for i in range(n))

    return make


async def test_call_runs_on_the_worker_thread_after_on_start() -> None:
    seen: list[str] = []
    worker = started(on_start=lambda: seen.append(threading.current_thread().name))
    try:
        name = await worker.call(lambda: threading.current_thread().name)
        assert name == "gw-inference" and seen == ["gw-inference"]
        assert threading.current_thread().name != "gw-inference"
    finally:
        worker.stop()


async def test_call_reraises_the_functions_error() -> None:
    worker = started()
    try:
        with pytest.raises(ZeroDivisionError):
            await worker.call(lambda: 1 // 0)
        assert await worker.call(lambda: 7) == 7  # the thread survived
    finally:
        worker.stop()


async def test_a_call_is_not_starved_by_busy_slots() -> None:
    """With every slot taken by a job that never ends, a call still runs between steps."""
    worker = started(max_active=1)

    def forever(cancelled: Callable[[], bool]) -> Iterator[int]:
        i = 0
        while True:
            i += 1
            yield i

    job = worker.submit(forever)
    waiting = worker.submit(counting(2, "w"))
    try:
        events = worker.events(job)
        assert await anext(events) == 1
        assert await asyncio.wait_for(worker.call(lambda: "ran"), timeout=10) == "ran"
        assert worker.depth == 2  # the endless job runs, the other one still waits
    finally:
        job.cancelled.set()
        assert [e async for e in worker.events(waiting)] == ["w0", "w1"]
        worker.stop()


async def test_call_before_start_is_refused() -> None:
    worker = InferenceWorker(WorkerOptions(capacity=1, max_active=1))
    with pytest.raises(RuntimeError, match="not running"):
        await worker.call(lambda: None)


async def test_stop_finishes_every_accepted_job() -> None:
    worker = started(max_active=1)
    jobs = [worker.submit(counting(3, tag)) for tag in "abc"]
    await asyncio.to_thread(worker.stop)
    for job, tag in zip(jobs, "abc", strict=True):
        assert [e async for e in worker.events(job)] == [f"{tag}{i}" for i in range(3)]


async def test_the_pool_loads_models_through_its_runner(tmp_path: Path) -> None:
    """Targets and drafts load where the runner says (the inference thread), never inline."""
    manifest = load_manifest(tiny_models.build(tmp_path))
    threads: list[str] = []
    worker = started()

    async def runner(fn: Callable[[], object]) -> object:
        def recorded() -> object:
            threads.append(threading.current_thread().name)
            return fn()

        return await worker.call(recorded)

    pool = ModelPool(manifest, runner, PoolOptions(device="cpu"))
    try:
        await pool.load_targets()
        target = manifest.targets()[0].name
        version = pool.draft_versions(target)[0]
        handle = await pool.draft(target, version)
        assert handle is await pool.draft(target, version)  # loaded once
        assert threads == ["gw-inference", "gw-inference"]
        with pytest.raises(GatewayError):
            await pool.target("no-such-model")
    finally:
        worker.stop()


async def test_decode_jobs_share_one_target_forward(tmp_path: Path, monkeypatch) -> None:
    """Three decode jobs on one engine become rows of one batch: forwards carry all three,
    and each still gets exactly the tokens it gets alone."""
    from gateway.engine import DecodeRequest, Finished, SamplingParams

    rows_per_forward: list[int] = []
    engine = spied_engine(
        tmp_path, monkeypatch, lambda slots, *_: rows_per_forward.append(len(slots))
    )
    prompts = [(5, 6, 7), (8, 9), (10, 11, 12, 13)]
    reqs = [DecodeRequest(p, SamplingParams(temperature=0.0, max_tokens=12)) for p in prompts]
    worker = started(max_active=8, max_batch=4)
    try:
        jobs = [worker.submit_decode(engine, r) for r in reqs]
        results = []
        for job in jobs:
            events = [e async for e in worker.events(job)]
            assert isinstance(events[-1], Finished)
            results.append(events[-1].result)
    finally:
        worker.stop()
    assert max(rows_per_forward) == 3, (rows_per_forward, [len(r.token_ids) for r in results])
    assert [r.token_ids for r in results] == [engine.run(r).token_ids for r in reqs]


async def test_a_failing_shared_forward_ends_its_rows_and_the_worker_goes_on(
    tmp_path: Path, monkeypatch
) -> None:
    """A forward that raises (a bug, out of memory) ends every row of its batch with the
    error; the thread lives on and the next request decodes on a fresh batch."""
    from gateway.engine import DecodeRequest, Engine, Finished, SamplingParams

    manifest = load_manifest(tiny_models.build(tmp_path))
    engine = Engine(load_fast(manifest.targets()[0].path, device="cpu", draft_vocab=False))
    calls: list[int] = []

    def broken_once(real):  # type: ignore[no-untyped-def]
        def forward(*args, **kw):  # type: ignore[no-untyped-def]
            calls.append(1)
            if len(calls) == 2:  # the first decode step, after the prefill
                raise RuntimeError("out of memory")
            return real(*args, **kw)

        return forward

    patch_target_forwards(monkeypatch, broken_once)
    req = DecodeRequest((5, 6, 7, 8), SamplingParams(temperature=0.0, max_tokens=6))
    worker = started(max_active=8, max_batch=4)
    try:

        async def drain(job):  # type: ignore[no-untyped-def]  # bounded: a dead thread hangs
            return await asyncio.wait_for(_collect(worker.events(job)), timeout=60)

        for job in [worker.submit_decode(engine, req) for _ in range(2)]:
            with pytest.raises(RuntimeError, match="out of memory"):
                await drain(job)
        events = await drain(worker.submit_decode(engine, req))
    finally:
        worker.stop()
    assert isinstance(events[-1], Finished)
    assert events[-1].result.token_ids == engine.run(req).token_ids


async def _collect(events):  # type: ignore[no-untyped-def]
    return [e async for e in events]


async def test_jobs_carry_their_queue_and_run_stamps() -> None:
    """The stamps the queue/prefill/decode spans and the queue-wait metric are made of: a job
    behind a busy slot waits, then runs; submitted <= admitted <= first event <= finished."""
    from gateway.serving.tracing import RunTimings

    worker = started(max_active=1)
    try:
        first = worker.submit(counting(3, "a"))
        second = worker.submit(counting(2, "b"))
        for job in (first, second):
            assert [x async for x in worker.events(job)]
        for job in (first, second):
            stamps = [job.submitted_ns, job.admitted_ns, job.first_event_ns, job.finished_ns]
            assert None not in stamps and stamps == sorted(stamps), stamps  # type: ignore[type-var]
        assert second.admitted_ns >= first.finished_ns  # type: ignore[operator]
        timings = RunTimings.of_jobs([first, second])
        assert timings.queue_s is not None and timings.decode_s is not None
        assert timings.queue_s >= (second.admitted_ns - second.submitted_ns) / 1e9  # type: ignore[operator]
    finally:
        worker.stop()


async def test_the_prefill_chunk_setting_reaches_the_batch(tmp_path: Path, monkeypatch) -> None:
    """GATEWAY_PREFILL_CHUNK: an arrival's prompt enters over steps of at most that many
    tokens, and decodes what it decodes alone; 0 is refused."""
    from gateway.engine import DecodeRequest, Finished, SamplingParams

    prefill_widths: list[int] = []

    def seen(slots: list[int], tokens: list[list[int]], kw: dict[str, object]) -> None:
        if kw.get("keep_last"):
            prefill_widths.append(max(len(t) for t in tokens))

    engine = spied_engine(tmp_path, monkeypatch, seen)
    req = DecodeRequest(tuple(range(5, 16)), SamplingParams(temperature=0.0, max_tokens=6))
    worker = started(max_active=8, max_batch=2, prefill_chunk=3)
    try:
        events = [e async for e in worker.events(worker.submit_decode(engine, req))]
    finally:
        worker.stop()
    assert isinstance(events[-1], Finished)
    assert prefill_widths == [3, 3, 3, 1]  # the 10 tokens before the last, 3 at a time
    assert events[-1].result.token_ids == engine.run(req).token_ids
    with pytest.raises(ValueError, match="GATEWAY_PREFILL_CHUNK"):
        WorkerOptions(capacity=1, max_active=1, prefill_chunk=0)


async def test_the_prefill_budget_setting_reaches_the_batch(tmp_path: Path, monkeypatch) -> None:
    """GATEWAY_PREFILL_BUDGET: the worker's batch prefills arrivals together within it (at
    least the chunk); 0 is refused."""
    from gateway.engine import DecodeRequest, Finished, SamplingParams

    engine = spied_engine(tmp_path, monkeypatch, lambda *a: None)
    made: list[object] = []
    real_batch = engine.batch

    def batch(*args, **kw):  # type: ignore[no-untyped-def]
        made.append(real_batch(*args, **kw))
        return made[-1]

    monkeypatch.setattr(engine, "batch", batch)
    req = DecodeRequest(tuple(range(5, 16)), SamplingParams(temperature=0.0, max_tokens=3))
    worker = started(max_active=8, max_batch=2, prefill_chunk=3, prefill_budget=6)
    try:
        events = [e async for e in worker.events(worker.submit_decode(engine, req))]
    finally:
        worker.stop()
    assert isinstance(events[-1], Finished)
    assert [(b.prefill_chunk, b.prefill_budget) for b in made] == [(3, 6)]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="GATEWAY_PREFILL_BUDGET"):
        WorkerOptions(capacity=1, max_active=1, prefill_budget=0)


async def test_a_draft_is_compiled_and_probed_for_its_targets_batch_rows(
    tmp_path: Path, monkeypatch
) -> None:
    """A draft's slots are as many as its target's batch rows, which the target's context
    length sets (with a KV budget); the draft is compiled for those rows, not for the rows
    its own context length would give (a one-slot cache is a size torch specialises), and
    forward costs are probed up to the batch's rows."""
    from dataclasses import replace

    from gateway.engine import Engine
    from gateway.engine.batch.costs import ForwardCosts
    from gateway.serving import models

    manifest = load_manifest(tiny_models.build(tmp_path))
    real_load = models.load_fast

    target_context: list[int] = []
    draft_paths = {str(e.path) for e in manifest.drafts_for(manifest.targets()[0].name)}

    def load_stretched(path, *args, **kw):  # type: ignore[no-untyped-def]
        lm = real_load(path, *args, **kw)  # a draft with twice its target's context
        if path in draft_paths:
            return replace(lm, context_length=2 * lm.context_length)
        target_context.append(lm.context_length)
        return lm

    compiled_for: list[tuple[bool, int]] = []
    probed: list[int] = []

    def compiled_model(model, rows, draft, **kw):  # type: ignore[no-untyped-def]
        compiled_for.append((draft, rows))
        return model, 0.0

    monkeypatch.setattr(models, "load_fast", load_stretched)
    monkeypatch.setattr(models, "compiled_model", compiled_model)

    def measure_costs(self, rows, draft=None, known=None):  # type: ignore[no-untyped-def]
        probed.append(rows)
        return ForwardCosts()

    monkeypatch.setattr(Engine, "measure_costs", measure_costs)
    worker = started(max_active=2)

    async def runner(fn):  # type: ignore[no-untyped-def]
        return await worker.call(fn)

    def rows_for(context: int) -> int:  # as batch_rows under a KV budget of 2 target contexts
        return max(1, 2 * target_context[0] // context)

    options = PoolOptions(device="cpu", probe_rows=8, compile_rows=rows_for, compile_mode="on")
    pool = ModelPool(manifest, runner, options)
    try:
        await pool.load_targets()
    finally:
        worker.stop()
    drafts = len(manifest.drafts_for(manifest.targets()[0].name))
    assert compiled_for == [(False, 2)] + [(True, 2)] * drafts  # the batch's 2, not 1
    assert probed == [2] * (1 + drafts)


def test_a_steps_events_reach_the_event_loop_in_one_wake_up_each_job_in_order() -> None:
    """The worker hands a step's events for all its rows to the event loop at once (one
    `call_soon_threadsafe`, one write to the loop's self-pipe), not one per row; each job
    still gets its own events, in order, and a closed loop cancels the jobs instead."""
    from gateway.serving.jobs import Job, Outbox

    loop = asyncio.new_event_loop()
    wakeups: list[object] = []
    real = loop.call_soon_threadsafe

    def counted(*args: object) -> object:
        wakeups.append(args[0])
        return real(*args)  # type: ignore[arg-type]

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        jobs = [Job(make=None, loop=loop) for _ in range(3)]
        out = Outbox()
        for step in range(2):
            for i, job in enumerate(jobs):
                out.add(job, f"job{i} event{step}")
        done = threading.Thread(target=out.flush)  # from another thread, as the worker
        done.start()
        done.join()
        assert len(wakeups) == 1
        loop.run_until_complete(asyncio.sleep(0))
        for i, job in enumerate(jobs):
            got = [job.out.get_nowait() for _ in range(job.out.qsize())]
            assert got == [f"job{i} event0", f"job{i} event1"]
            assert job.first_event_ns is not None and not job.cancelled.is_set()
    finally:
        loop.close()
    out.add(jobs[0], "late")
    out.flush()  # the loop is closed: nobody listens any more
    assert jobs[0].cancelled.is_set()
