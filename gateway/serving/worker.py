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
all its rows (``Outbox``); a cancelled job (client gone) ends at its next step, which
frees its row. The jobs and their way back: serving/jobs.py; the batches and their rows'
jobs: serving/batches.py.
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
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.engine import (
    PREFILL_BUDGET,
    PREFILL_CHUNK,
    DecodeRequest,
    Delta,
    Engine,
    Finished,
    LoadedModel,
)
from gateway.serving.batches import Batches, batch_rows
from gateway.serving.fairness import SYSTEM, FairQueue, Overloaded, Share, StepPacer
from gateway.serving.jobs import DONE, Call, Decode, Job, Outbox

__all__ = ["InferenceWorker", "Job", "Overloaded", "Share", "batch_rows"]

T = TypeVar("T")
log = logging.getLogger("gateway")
_WAKE = object()  # a job was queued: the worker thread looks at the fair queue


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
    preempt: bool = True
    """A tenant past its share of a full batch's rows gives one up to an arriving tenant
    (its row parked until it resumes in its turn: serving/fairness.py)."""

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
        self.preempt = options.preempt
        self.preemptions = 0  # rows parked for another tenant's job (worker thread)
        self.pacer = StepPacer()
        self.capacity = options.capacity
        self.max_active = options.max_active
        self.max_batch = options.max_batch
        self.kv_budget_tokens = options.kv_budget_tokens
        self._on_start = on_start
        self._inbox: queue.Queue[object] = queue.Queue()
        self.fair = FairQueue(options.capacity, options.max_batch, options.preempt)
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
        return self.fair.waiting + self.fair.parked + self._active

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
            for item in (exc, DONE):
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
        self._inbox.put(Call(fn, loop, future))
        return await future

    async def events(self, job: Job) -> AsyncIterator[Any]:
        """The job's events in order; an exception raised by the job is re-raised here.
        Leaving early (client gone, error) cancels the job."""
        try:
            while True:
                item = await job.out.get()
                if item is DONE:
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
        batches = Batches(
            self.max_batch, self.kv_budget_tokens, self.prefill_chunk, self.prefill_budget
        )
        stopping = False
        while True:
            # 1. Take what arrived: calls run now (jobs are in the fair queue already). Block
            #    only when there is nothing to step.
            pending = self.fair.waiting + self.fair.parked
            idle = not active and not batches.rows and not pending and not stopping
            while True:
                try:
                    item = self._inbox.get(block=idle)
                except queue.Empty:
                    break
                idle = False
                if item is None:
                    stopping = True
                elif isinstance(item, Call):
                    item.run()
            # 2. Admit waiting jobs into free slots, each tenant in its turn (after a stop,
            #    only those accepted).
            self._admit(active, batches)
            if not active and not batches.rows:
                if stopping and not self.fair.waiting + self.fair.parked:
                    return
                continue
            # 3. One step of every batch (all its rows together), then of every other job;
            #    the batches' events go out together, then the other jobs'.
            out = Outbox()
            for job, events in batches.step(self.pacer if self.fair_steps else None):
                for event in events:
                    if isinstance(event, Exception):
                        self._finish(job, event, out)
                        break
                    if isinstance(event, Delta):
                        self.fair.charge(job.share, output_tokens=len(event.token_ids))
                    out.add(job, event)
                    if isinstance(event, Finished):
                        self._finish(job, DONE, out)
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
                    self._finish(job, DONE, out)
                except BaseException as exc:
                    self._finish(job, exc, out)
            out.flush()
            active = still

    def _admit(self, active: list[tuple[Job, Iterator[Any]]], batches: Batches) -> None:
        """Fill free slots from the fair queue (serving/fairness.py): the tenant with the
        fewest weighted tokens served first, skipping jobs whose batch is full (others may
        still fit) unless a tenant over its share gives a row up (preemption: its row is
        parked and its job goes back to the queue); jobs cancelled while waiting end
        without running."""
        out = Outbox()
        full = False  # every active place is taken: only a preemption admits

        def fits(job: Job) -> bool:
            if not full and (job.decode is None or batches.has_room(job.decode.engine)):
                return True
            return self.preempt and batches.preemptible(job) is not None

        while True:
            full = len(active) + batches.rows >= self.max_active
            job, dropped = self.fair.pick(fits, lambda j: batches.default_cap(j, self.preempt))
            for gone in dropped:
                if gone.parked is not None and gone.decode is not None:
                    gone.parked = None  # its keys and values go with it
                    batches.unpark(gone.decode)
                gone.finished_ns = time.time_ns()
                out.add(gone, DONE)
            if job is None:
                break
            with self._lock:
                self._active += 1
            full_batch = job.decode is not None and not batches.has_room(job.decode.engine)
            if full_batch and not self._park_for(job, batches):
                break  # tried again next round, when rows may have ended
            if job.admitted_ns is None:  # a parked job resuming keeps its first admission
                job.admitted_ns = time.time_ns()
            try:
                if job.decode is not None:
                    # the prompt tokens it computes: a reused prefix (or a resume) costs none
                    fresh = batches.add(job)
                    self.fair.charge(job.share, prompt_tokens=fresh)
                else:
                    assert job.make is not None
                    active.append((job, job.make(job.cancelled.is_set)))
            except BaseException as exc:
                self._finish(job, exc, out)
        out.flush()

    def _park_for(self, job: Job, batches: Batches) -> bool:
        """Make room for ``job`` (picked because `fits` saw a row it may take): the row of
        the tenant furthest past its share is parked and its job waits to resume. If that
        fails (out of memory copying its keys and values out), ``job`` goes back to the
        front of its queue and nothing else changes; returns whether room was made."""
        row = batches.preemptible(job)
        try:
            if row is None:
                raise RuntimeError("no row to preempt for a job picked by preemption")
            back = batches.park(row)  # the parked row's job goes back to the queue
        except Exception:
            log.exception("preemption failed; tenant %s waits for a row", job.share.tenant)
            back = job  # the arrival goes back instead
        with self._lock:
            self._active -= 1
        self.fair.requeue(back)
        self.preemptions += back is not job
        return back is not job

    def _close(self, job: Job, steps: Iterator[Any], out: Outbox) -> None:
        close = getattr(steps, "close", None)
        if close is not None:
            close()
        self._finish(job, DONE, out)

    def _finish(self, job: Job, item: Any, out: Outbox) -> None:
        with self._lock:
            self._active -= 1
        self.fair.release(job.share)
        job.finished_ns = time.time_ns()
        out.add(job, item)
