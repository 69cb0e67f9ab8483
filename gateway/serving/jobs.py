"""What the inference worker runs and how its results go back: a decode job or an
iterator job (`Job`), the events of a round handed to each event loop at once (`Outbox`),
and a function run once on the inference thread (`Call`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.engine import DecodeRequest, Engine, LoadedModel, Parked
from gateway.serving.fairness import SYSTEM, Share

DONE = object()  # a job's last item: no more events


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
    held its row cap, or its row was parked for another tenant's): its record says so."""
    parked: Parked | None = None
    """Its row, parked to make room for another tenant's (serving/batches.py), waiting in
    the fair queue to resume."""
    out: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted_ns: int = field(default_factory=time.time_ns)
    """Wall-clock stamps (ns since the epoch, what trace spans take): queued, admitted to a
    batch or the round-robin, first event out, finished. Set by the worker thread."""
    admitted_ns: int | None = None
    first_event_ns: int | None = None
    finished_ns: int | None = None


class Outbox:
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
class Call:
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
