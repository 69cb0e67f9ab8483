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
torch. tests/integration/service/test_inference_thread.py compares its forwards with the
same forwards in a plain script's main thread.

Each job is an iterator that does one decoding step per ``next()`` (the engine's stream).
The thread interleaves up to ``max_active`` jobs round-robin, one step each, so concurrent
clients all make progress; the rest wait in a bounded queue and a full queue is refused at
once (``Overloaded``) instead of hanging. Calls (model loads) run between two rounds of
steps, ahead of waiting jobs. Events travel back to the event loop through
``call_soon_threadsafe``; a cancelled job (client gone) is closed before its next step,
which frees its slot.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
_DONE = object()


class Overloaded(Exception):
    """The queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, depth: int, retry_after: int = 1) -> None:
        super().__init__(f"the inference queue is full ({depth} waiting); retry shortly")
        self.depth = depth
        self.retry_after = retry_after


@dataclass
class Job:
    """One request's decoding, seen from the worker."""

    make: Callable[[Callable[[], bool]], Iterator[Any]]
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def emit(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()


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


class InferenceWorker:
    def __init__(
        self,
        capacity: int,
        max_active: int,
        name: str = "inference",
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """``on_start`` runs first on the thread (set torch's thread count there)."""
        self.capacity = capacity
        self.max_active = max_active
        self._on_start = on_start
        self._inbox: queue.Queue[Job | _Call | None] = queue.Queue()
        self._waiting = 0
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
        if self._started:
            self._inbox.put(None)
            self._thread.join(timeout)

    @property
    def thread_id(self) -> int | None:
        """The OS thread's native id once started (what /proc and profilers show)."""
        return self._thread.native_id

    @property
    def depth(self) -> int:
        """Requests waiting plus running: the load the policy engine sees."""
        return self._waiting + self._active

    def submit(self, make: Callable[[Callable[[], bool]], Iterator[Any]]) -> Job:
        """Queue a job; ``make(cancelled)`` builds its step iterator in the worker thread."""
        with self._lock:
            if self._waiting >= self.capacity:
                raise Overloaded(self._waiting)
            self._waiting += 1
        job = Job(make=make, loop=asyncio.get_running_loop())
        self._inbox.put(job)
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
        if self._on_start is not None:
            self._on_start()
        waiting: collections.deque[Job] = collections.deque()
        active: list[tuple[Job, Iterator[Any]]] = []
        stopping = False
        while True:
            # 1. Take what arrived: calls run now, jobs join the waiting line. Block only
            #    when there is nothing to step.
            idle = not active and not waiting and not stopping
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
                else:
                    waiting.append(item)
            # 2. Admit waiting jobs into free slots (after a stop, only those accepted).
            while waiting and len(active) < self.max_active:
                job = waiting.popleft()
                with self._lock:
                    self._waiting -= 1
                    self._active += 1
                try:
                    active.append((job, job.make(job.cancelled.is_set)))
                except BaseException as exc:
                    self._finish(job, exc)
            if not active:
                if stopping and not waiting:
                    return
                continue
            # 3. One step of every active job.
            still: list[tuple[Job, Iterator[Any]]] = []
            for job, steps in active:
                if job.cancelled.is_set():
                    self._close(job, steps)
                    continue
                try:
                    job.emit(next(steps))
                    still.append((job, steps))
                except StopIteration:
                    self._finish(job, _DONE)
                except BaseException as exc:
                    self._finish(job, exc)
            active = still

    def _close(self, job: Job, steps: Iterator[Any]) -> None:
        close = getattr(steps, "close", None)
        if close is not None:
            close()
        self._finish(job, _DONE)

    def _finish(self, job: Job, item: Any) -> None:
        with self._lock:
            self._active -= 1
        job.emit(item)
