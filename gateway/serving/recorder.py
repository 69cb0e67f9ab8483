"""Writes each request's audit records (fail-closed), then tells the listeners.

Record first, act second: a served request's admission (``admit``) is durable before its
first output byte; its final record (``record``) completes it and is awaited too, so a
completion is only returned after its record is durable. Between the two the request is
open: ``abort_open`` ends what is still open (shutdown, after its grace). Metrics and logs
listen to final records only; the rollout guard and the acceptance history are fed by the
generation service's finish, in that order, after the write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from gateway.database import Admission, AuditUnavailable, AuditWriter, Payload, RequestRecord
from gateway.engine import DecodeResult
from gateway.serving.errors import GatewayError
from gateway.serving.tracing import RunTimings

log = logging.getLogger("gateway.database")
RETRY_AFTER_FAILURE_S = 2.0
ABORTED_RECORD_WAIT_S = 5.0
"""After the shutdown grace: how long the aborted requests get to write their records."""


def shutting_down(grace_s: float) -> GatewayError:
    """The error of a request the shutdown ended (its record: 503, ``shutting_down``)."""
    return GatewayError(
        "unavailable",
        f"the gateway is shutting down; requests still running after its {grace_s:g} s grace "
        "are ended",
        code="shutting_down",
        retry_after=1,
    )


@dataclass(frozen=True)
class Observed:
    """What the listeners (metrics, logs) are told of one finished request."""

    record: RequestRecord
    result: DecodeResult | None = None
    """The engine's result (its stats), when the request decoded."""
    timings: RunTimings | None = None
    """Queue wait, first output, decode time, when the request reached the worker."""


Listener = Callable[[Observed], None]
Abort = Callable[[GatewayError], None]
"""Ends an open request (its engine runs stop at their next step) with the given error."""


class Recorder:
    def __init__(self, writer: AuditWriter, *, fail_closed: bool = True) -> None:
        self.writer = writer
        self.fail_closed = fail_closed
        self.listeners: list[Listener] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failed_at: float | None = None
        self._open: dict[str, Abort] = {}  # request id -> abort, admitted and not final
        self._none_open = asyncio.Event()
        self._none_open.set()
        self.draining: float | None = None
        """The shutdown grace (s) once a shutdown began: new requests are refused."""

    def check_writable(self) -> None:
        """Refuse new inference while shutting down, and for a moment after the audit store
        failed (fail-closed)."""
        if self.draining is not None:
            raise shutting_down(self.draining)
        if (
            self.fail_closed
            and self._failed_at is not None
            and time.monotonic() - self._failed_at < RETRY_AFTER_FAILURE_S
        ):
            raise GatewayError(
                "unavailable",
                "the audit store cannot be written; requests are refused until it recovers",
                code="audit_unavailable",
                retry_after=int(RETRY_AFTER_FAILURE_S),
            )

    async def _write(self, record: RequestRecord, payload: Payload | None) -> None:
        try:
            await self.writer.write(record, payload)
            self._failed_at = None
        except AuditUnavailable as exc:
            self._failed_at = time.monotonic()
            log.error("audit write failed: %s", exc)
            if self.fail_closed:
                raise GatewayError(
                    "unavailable",
                    "the audit store cannot be written; the completion is withheld",
                    code="audit_unavailable",
                    retry_after=int(RETRY_AFTER_FAILURE_S),
                ) from exc

    async def admit(self, admission: Admission, abort: Abort) -> int | None:
        """Write a request's admission (durable on return: before its first output byte)
        and hold the request open until its final record. Its id, for the final record to
        name; None when the write failed and the recorder is fail-open (the request is
        served, its failure logged). Fail-closed, a failed write raises GatewayError: the
        request is refused before any output."""
        try:
            admission_id: int | None = await self.writer.write(admission)
            self._failed_at = None
        except AuditUnavailable as exc:
            self._failed_at = time.monotonic()
            log.error("audit admission write failed: %s", exc)
            if self.fail_closed:
                raise GatewayError(
                    "unavailable",
                    "the audit store cannot be written; the request is refused before it runs",
                    code="audit_unavailable",
                    retry_after=int(RETRY_AFTER_FAILURE_S),
                ) from exc
            admission_id = None
        self._open[admission.request_id] = abort
        self._none_open.clear()
        return admission_id

    @property
    def open_requests(self) -> int:
        """Requests admitted whose final record is not yet written."""
        return len(self._open)

    async def wait_none_open(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s until no request is open; whether none is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_open.wait(), max(timeout, 0))
        return not self._open

    def abort_open(self, error: GatewayError) -> int:
        """End every open request with ``error`` (their final records say so); how many."""
        aborts = list(self._open.values())
        for abort in aborts:
            abort(error)
        return len(aborts)

    async def close_open(self, grace_s: float) -> int:
        """Shutdown: refuse new requests, give the open ones ``grace_s`` to finish, then end
        the rest (``shutting_down``: their records say 503) and give them a moment to write
        their records. How many were ended."""
        if self.draining is None:
            self.draining = grace_s
        if await self.wait_none_open(grace_s):
            return 0
        ended = self.abort_open(shutting_down(grace_s))
        log.warning("shutdown grace of %g s over: %d requests ended", grace_s, ended)
        await self.wait_none_open(ABORTED_RECORD_WAIT_S)
        return ended

    def _close(self, request_id: str) -> None:
        self._open.pop(request_id, None)
        if not self._open:
            self._none_open.set()

    async def record(
        self,
        record: RequestRecord,
        payload: Payload | None,
        result: DecodeResult | None,
        *,
        best_effort: bool = False,
        timings: RunTimings | None = None,
    ) -> None:
        """The one entrance, for served and refused requests alike: write the record
        (durable on return), then tell the listeners (metrics, logs). A failed write raises
        GatewayError when fail-closed, unless `best_effort` (a refusal: the client gets its
        original error)."""
        try:
            if best_effort:
                with contextlib.suppress(GatewayError):
                    await self._write(record, payload)
            else:
                await self._write(record, payload)
        finally:
            self._close(record.request_id)  # written or not: the request is over
        observed = Observed(record, result, timings)
        for listener in self.listeners:
            listener(observed)

    def detach(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background; drain() waits for it at shutdown."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background audit task failed", exc_info=task.exception())

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
