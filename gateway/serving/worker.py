"""The inference worker: one thread per device, fed by a bounded queue.

Each job is an iterator that does one decoding step per ``next()`` (the engine's stream).
The worker thread interleaves up to ``max_active`` jobs round-robin, one step each, so
concurrent clients all make progress; the rest wait in a bounded queue and a full queue
is refused at once (``Overloaded``) instead of hanging. Events travel back to the event
loop through ``call_soon_threadsafe``; a cancelled job (client gone) is closed before its
next step, which frees its slot.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

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


class InferenceWorker:
    def __init__(self, capacity: int, max_active: int, name: str = "inference") -> None:
        self.capacity = capacity
        self.max_active = max_active
        self._pending: queue.Queue[Job | None] = queue.Queue()
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
            self._pending.put(None)
            self._thread.join(timeout)

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
        self._pending.put(job)
        return job

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
        active: list[tuple[Job, Iterator[Any]]] = []
        stopping = False
        while True:
            while len(active) < self.max_active and not stopping:
                try:
                    job = self._pending.get(block=not active)
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                with self._lock:
                    self._waiting -= 1
                    self._active += 1
                try:
                    active.append((job, job.make(job.cancelled.is_set)))
                except BaseException as exc:
                    self._finish(job, exc)
            if not active:
                if stopping:
                    return
                continue
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
