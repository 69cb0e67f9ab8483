"""The inference worker: the one thread that owns torch, fed by a bounded queue.

Where torch runs is part of the design. torch's CPU kernels run on libgomp thread teams,
one pool per OS thread that ever opened a parallel region, kept while that thread lives.
Measured on the 2-core machine: once a second live thread had run one parallel op, a demo
target step on this thread took 18-19 ms instead of 11-12 ms, at about 113% CPU instead
of 198%. (Our reading: with more pooled threads than cores, libgomp throttles its spinning
between regions, so every region of a step waits for a sleeping thread to wake.) Loading
a draft did exactly that: its load-time check runs a forward, on the event loop (first
speculative request) or in ``asyncio.to_thread`` (rollouts). So this thread loads every
model (``call``) and runs every decoding step; no other thread of the gateway calls into
torch. The thread carries its name into the OS (``top -H``, py-spy), and the thread pools it
opens inherit it, which is how tests/integration/service/test_inference_thread.py checks
that no other thread ever opened one; ``python -m benchmarks inference_thread`` times its
forwards against the same forwards in a plain script's main thread.

A decode job (``submit_decode``) becomes a row of its target's continuous batch
(gateway/engine/batch): every round, each batch advances all its rows by one step in shared
target forwards, and rows join and leave between rounds, up to ``max_batch`` rows per
target. Other jobs (``submit``: an iterator doing one step per ``next()``, e.g. the
regression gate) step round-robin beside them. At most ``max_active`` jobs run at once;
the rest wait in a bounded queue and a full queue is refused at once (``Overloaded``)
instead of hanging. Calls (model loads) run between two rounds, ahead of waiting jobs.
Events travel back to the event loop through ``call_soon_threadsafe``, one call a step for
all its rows (``_Outbox``); a cancelled job (client gone) ends at its next step, which
frees its row.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.engine import DecodeRequest, Engine, Finished, LoadedModel
from gateway.engine.batch.scheduler import Batch, Event, Row
from gateway.engine.batch.slots import PREFILL_BUDGET, PREFILL_CHUNK
from gateway.engine.schema import Delta
from gateway.serving.fairness import SYSTEM, FairQueue, Overloaded, Share, StepPacer

__all__ = ["InferenceWorker", "Job", "Overloaded", "Share", "batch_rows"]

T = TypeVar("T")
log = logging.getLogger("gateway")
_DONE = object()
_WAKE = object()  # a job was queued: the worker thread looks at the fair queue


@dataclass(frozen=True)
class Decode:
    """What a decode job runs: a request on an engine (``Engine``), with its draft model."""

    engine: Engine
    request: DecodeRequest
    draft: LoadedModel | None = None


@dataclass
class Job:
    """One request's decoding, seen from the worker: an iterator job (``make``) or a row of
    a continuous batch (``decode``)."""

    make: Callable[[Callable[[], bool]], Iterator[Any]] | None
    loop: asyncio.AbstractEventLoop
    decode: Decode | None = None
    share: Share = SYSTEM
    """Whose job this is and what the tenant's policy grants it (serving/fairness.py)."""
    fair_wait: bool = False
    """Held back while a row was free so that another tenant's job ran first (or its tenant
    held its row cap): the request's record says so."""
    out: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted_ns: int = field(default_factory=time.time_ns)
    """Wall-clock stamps (ns since the epoch, what trace spans take): queued, admitted to a
    batch or the round-robin, first event out, finished. Set by the worker thread."""
    admitted_ns: int | None = None
    first_event_ns: int | None = None
    finished_ns: int | None = None


class _Outbox:
    """How events leave the worker thread: those of a round's steps, handed to each event
    loop in one `call_soon_threadsafe`, one wake-up of the loop a step instead of one per
    row. Every wake-up writes to the loop's self-pipe, a system call that lets the event
    loop take the GIL from this thread, so with 8 rows a step handed it over up to 8 times.
    Each job's events keep their order; a closed loop (nobody listening) cancels the job."""

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, Any]]] = {}

    def add(self, job: Job, item: Any) -> None:
        if job.first_event_ns is None:
            job.first_event_ns = time.time_ns()
        self._by_loop.setdefault(job.loop, []).append((job, item))

    def flush(self) -> None:
        for loop, items in self._by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                for job, _ in items:
                    job.cancelled.set()
        self._by_loop.clear()


def _deliver(items: list[tuple[Job, Any]]) -> None:
    """On the event loop: each event into its job's queue, in order."""
    for job, item in items:
        job.out.put_nowait(item)


@dataclass
class _Call:
    """A function to run once on the inference thread (a model load); its result or
    exception settles ``future`` on the caller's event loop."""

    fn: Callable[[], Any]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]

    def run(self) -> None:
        try:
            outcome: tuple[bool, Any] = (True, self.fn())
        except BaseException as exc:
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(self._settle, outcome)

    def _settle(self, outcome: tuple[bool, Any]) -> None:
        if self.future.cancelled():
            return
        ok, value = outcome
        if ok:
            self.future.set_result(value)
        else:
            self.future.set_exception(value)


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` in the OS (Linux: at most 15 bytes). Threads it
    starts later, libgomp's pool among them, inherit the name."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How the inference worker queues, batches and paces its work (the GATEWAY_QUEUE_*,
    _MAX_*, _KV_BUDGET_TOKENS, _PREFILL_* and _FAIR_STEPS settings)."""

    capacity: int
    """Jobs that may wait in the fair queue."""
    max_active: int
    """Jobs running at once (batch rows of every engine included)."""
    max_batch: int = 8
    """Rows of one engine's continuous batch, at most."""
    kv_budget_tokens: int | None = None
    """KV cache tokens of one batch: its rows are capped at budget // context length;
    None: no cap beyond ``max_batch``."""
    prefill_chunk: int = PREFILL_CHUNK
    prefill_budget: int = PREFILL_BUDGET
    fair_steps: bool = True
    """A tenant served past its share of a batch's time sits steps out (`StepPacer`)."""

    def __post_init__(self) -> None:
        if self.prefill_chunk < 1:
            raise ValueError(f"GATEWAY_PREFILL_CHUNK must be at least 1, got {self.prefill_chunk}")
        if self.prefill_budget < 1:
            raise ValueError(
                f"GATEWAY_PREFILL_BUDGET must be at least 1, got {self.prefill_budget}"
            )


class InferenceWorker:
    def __init__(
        self,
        options: WorkerOptions,
        *,
        name: str = "gw-inference",
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """``on_start`` runs first on the thread (set torch's thread count there)."""
        self.options = options
        self.prefill_chunk = options.prefill_chunk
        self.prefill_budget = options.prefill_budget
        self.fair_steps = options.fair_steps
        self.pacer = StepPacer()
        self.capacity = options.capacity
        self.max_active = options.max_active
        self.max_batch = options.max_batch
        self.kv_budget_tokens = options.kv_budget_tokens
        self._on_start = on_start
        self._inbox: queue.Queue[object] = queue.Queue()
        self.fair = FairQueue(options.capacity, options.max_batch)
        self._active = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    # -- event-loop side ----------------------------------------------------------------

    def start(self) -> None:
        if not self._started:
            self._thread.start()
            self._started = True

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the accepted jobs (cancelled ones end at their next step) and stop the
        thread; wait at most ``timeout`` s (the shutdown grace), then leave it behind."""
        if self._started:
            self._inbox.put(None)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning(
                    "inference thread still busy %g s after stop; shutting down without it",
                    timeout,
                )

    @property
    def thread_id(self) -> int | None:
        """The OS thread's native id once started (what /proc and profilers show)."""
        return self._thread.native_id

    @property
    def thread_name(self) -> str:
        return self._thread.name

    @property
    def depth(self) -> int:
        """Requests waiting plus running: the load the policy engine sees."""
        return self.fair.waiting + self._active

    def submit(
        self, make: Callable[[Callable[[], bool]], Iterator[Any]], share: Share = SYSTEM
    ) -> Job:
        """Queue a job; ``make(cancelled)`` builds its step iterator in the worker thread."""
        return self._enqueue(Job(make=make, loop=asyncio.get_running_loop(), share=share))

    def submit_decode(
        self,
        engine: Engine,
        request: DecodeRequest,
        draft: LoadedModel | None = None,
        share: Share = SYSTEM,
    ) -> Job:
        """Queue a request as a row of its engine's continuous batch (validated, and its
        loop wired, by ``engine.prepare`` on the worker thread), in its tenant's turn."""
        loop = asyncio.get_running_loop()
        decode = Decode(engine, request, draft)
        return self._enqueue(Job(make=None, loop=loop, decode=decode, share=share))

    def _enqueue(self, job: Job) -> Job:
        """Into the fair queue (Overloaded when the tenant holds its cap or its share of a
        full queue); a job evicted for it ends with Overloaded, a 503 to its tenant."""
        evicted = self.fair.offer(job)
        if evicted is not None:
            evicted.finished_ns = time.time_ns()
            exc = Overloaded(self.fair.waiting, detail=(
                f"the inference queue is full and tenant {evicted.share.tenant} holds more "
                "than its share of it; retry shortly"
            ))  # fmt: skip
            for item in (exc, _DONE):
                evicted.loop.call_soon_threadsafe(evicted.out.put_nowait, item)
        self._inbox.put(_WAKE)
        return job

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the inference thread and return its result (or raise its error).
        Everything that touches torch outside a job (loading a model) goes through here."""
        if not self._started:
            raise RuntimeError("the inference worker is not running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._inbox.put(_Call(fn, loop, future))
        return await future

    async def events(self, job: Job) -> AsyncIterator[Any]:
        """The job's events in order; an exception raised by the job is re-raised here.
        Leaving early (client gone, error) cancels the job."""
        try:
            while True:
                item = await job.out.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            job.cancelled.set()

    # -- worker-thread side -------------------------------------------------------------

    def _run(self) -> None:
        name_os_thread(self._thread.name)
        if self._on_start is not None:
            self._on_start()
        active: list[tuple[Job, Iterator[Any]]] = []
        batches = _Batches(
            self.max_batch, self.kv_budget_tokens, self.prefill_chunk, self.prefill_budget
        )
        stopping = False
        while True:
            # 1. Take what arrived: calls run now (jobs are in the fair queue already). Block
            #    only when there is nothing to step.
            idle = not active and not batches.rows and not self.fair.waiting and not stopping
            while True:
                try:
                    item = self._inbox.get(block=idle)
                except queue.Empty:
                    break
                idle = False
                if item is None:
                    stopping = True
                elif isinstance(item, _Call):
                    item.run()
            # 2. Admit waiting jobs into free slots, each tenant in its turn (after a stop,
            #    only those accepted).
            self._admit(active, batches)
            if not active and not batches.rows:
                if stopping and not self.fair.waiting:
                    return
                continue
            # 3. One step of every batch (all its rows together), then of every other job;
            #    the batches' events go out together, then the other jobs'.
            out = _Outbox()
            for job, events in batches.step(self.pacer if self.fair_steps else None):
                for event in events:
                    if isinstance(event, Exception):
                        self._finish(job, event, out)
                        break
                    if isinstance(event, Delta):
                        self.fair.charge(job.share, output_tokens=len(event.token_ids))
                    out.add(job, event)
                    if isinstance(event, Finished):
                        self._finish(job, _DONE, out)
            out.flush()
            still: list[tuple[Job, Iterator[Any]]] = []
            for job, steps in active:
                if job.cancelled.is_set():
                    self._close(job, steps, out)
                    continue
                try:
                    out.add(job, next(steps))
                    still.append((job, steps))
                except StopIteration:
                    self._finish(job, _DONE, out)
                except BaseException as exc:
                    self._finish(job, exc, out)
            out.flush()
            active = still

    def _admit(self, active: list[tuple[Job, Iterator[Any]]], batches: _Batches) -> None:
        """Fill free slots from the fair queue (serving/fairness.py): the tenant with the
        fewest weighted tokens served first, skipping jobs whose batch is full (others may
        still fit); jobs cancelled while waiting end without running."""
        out = _Outbox()

        def fits(job: Job) -> bool:
            return job.decode is None or batches.has_room(job.decode.engine)

        while True:
            job, dropped = (
                self.fair.pick(fits, batches.rows_of)
                if len(active) + batches.rows < self.max_active
                else (None, self.fair.pick(lambda _: False)[1])
            )
            for gone in dropped:
                gone.finished_ns = time.time_ns()
                out.add(gone, _DONE)
            if job is None:
                break
            with self._lock:
                self._active += 1
            job.admitted_ns = time.time_ns()
            try:
                if job.decode is not None:
                    # the prompt tokens it computes: a reused prefix costs nothing
                    fresh = batches.add(job)
                    self.fair.charge(job.share, prompt_tokens=fresh)
                else:
                    assert job.make is not None
                    active.append((job, job.make(job.cancelled.is_set)))
            except BaseException as exc:
                self._finish(job, exc, out)
        out.flush()

    def _close(self, job: Job, steps: Iterator[Any], out: _Outbox) -> None:
        close = getattr(steps, "close", None)
        if close is not None:
            close()
        self._finish(job, _DONE, out)

    def _finish(self, job: Job, item: Any, out: _Outbox) -> None:
        with self._lock:
            self._active -= 1
        self.fair.release(job.share)
        job.finished_ns = time.time_ns()
        out.add(job, item)


class _Batches:
    """The continuous batch of each target engine, and which job each row belongs to."""

    def __init__(
        self, max_rows: int, kv_budget_tokens: int | None = None,
        prefill_chunk: int = PREFILL_CHUNK, prefill_budget: int = PREFILL_BUDGET,
    ) -> None:  # fmt: skip
        self.max_rows = max_rows
        self.kv_budget_tokens = kv_budget_tokens
        self.prefill_chunk = prefill_chunk
        self.prefill_budget = prefill_budget
        self._batches: dict[int, Batch] = {}  # id(engine) -> engine.batch(max_rows)
        self._jobs: dict[int, Job] = {}  # id(row) -> its job

    @property
    def rows(self) -> int:
        return len(self._jobs)

    def rows_of(self, job: Job) -> int:
        """Rows of the batch the job would join (what its tenant's default row cap is
        taken from)."""
        if job.decode is None:
            return self.max_rows
        ctx = job.decode.engine.context_length
        return batch_rows(self.max_rows, self.kv_budget_tokens, ctx)

    def has_room(self, engine: Engine) -> bool:
        batch = self._batches.get(id(engine))
        return batch is None or batch.free > 0

    def add(self, job: Job) -> int:
        """The job's row joins its engine's batch; returns the prompt tokens it will
        prefill (those a kept prefix does not already hold)."""
        d = job.decode
        assert d is not None
        batch = self._batches.get(id(d.engine))
        if batch is None:
            rows = self.rows_of(job)
            batch = d.engine.batch(rows, self.prefill_chunk, self.prefill_budget)
            self._batches[id(d.engine)] = batch
        row = batch.add(d.engine.prepare(d.request, d.draft), job.cancelled.is_set)
        self._jobs[id(row)] = job
        return len(row.cfg.prompt_ids) - row.prefilled

    def step(self, pacer: StepPacer | None = None) -> list[tuple[Job, list[Event]]]:
        """One step of every batch. With a ``pacer`` (serving/fairness.py `StepPacer`), the
        rows of a tenant past its share of the batch's time sit the step out (their jobs
        are marked as having waited for fairness), and the step's time is charged to the
        tenants of the rows that took it."""
        out: list[tuple[Job, list[Event]]] = []
        for key, batch in list(self._batches.items()):
            if not batch.rows:
                continue
            held: list[Row] = []
            taking = [self._jobs[id(r)].share for r in batch.rows]
            if pacer is not None:
                sitting = pacer.pace(key, taking)
                held = [r for r in batch.rows if self._jobs[id(r)].share.tenant in sitting]
                taking = [s for s in taking if s.tenant not in sitting]
                for row in held:
                    self._jobs[id(row)].fair_wait = True
            t0 = time.perf_counter()
            try:
                stepped = batch.step(held)
            except Exception as exc:  # a shared forward failed (a bug, out of memory):
                # every row of the batch ends with the error instead of the thread dying
                # and every request hanging; the next arrival gets a fresh batch
                del self._batches[key]
                if pacer is not None:
                    pacer.forget(key)
                for row in batch.rows:
                    out.append((self._jobs.pop(id(row)), [exc]))
                continue
            if pacer is not None:
                pacer.spend(taking, time.perf_counter() - t0)
            for row, events in stepped:
                job = self._jobs[id(row)]
                if row.finished:
                    del self._jobs[id(row)]
                out.append((job, events))
        return out


def batch_rows(max_rows: int, kv_budget_tokens: int | None, context_length: int) -> int:
    """Rows of a target's batch: max_rows, capped by the KV budget (each row's slot holds
    the target's full context), at least one."""
    if kv_budget_tokens is None:
        return max_rows
    return max(1, min(max_rows, kv_budget_tokens // max(1, context_length)))
