"""Writes each request's audit record (fail-closed), then tells the listeners.

The record is awaited: a completion is only returned after its record is durable. Metrics
and logs listen; the rollout guard and the acceptance history are fed by the generation
service's finish, in that order, after the write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from gateway.database import AuditUnavailable, AuditWriter, Payload, RequestRecord
from gateway.engine import DecodeResult
from gateway.serving.errors import GatewayError
from gateway.serving.tracing import RunTimings

log = logging.getLogger("gateway.database")
RETRY_AFTER_FAILURE_S = 2.0


@dataclass(frozen=True)
class Observed:
    """What the listeners (metrics, logs) are told of one finished request."""

    record: RequestRecord
    result: DecodeResult | None = None
    """The engine's result (its stats), when the request decoded."""
    timings: RunTimings | None = None
    """Queue wait, first output, decode time, when the request reached the worker."""


Listener = Callable[[Observed], None]


class Recorder:
    def __init__(self, writer: AuditWriter, *, fail_closed: bool = True) -> None:
        self.writer = writer
        self.fail_closed = fail_closed
        self.listeners: list[Listener] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failed_at: float | None = None

    def check_writable(self) -> None:
        """Refuse new inference for a moment after the audit store failed (fail-closed)."""
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
        if best_effort:
            with contextlib.suppress(GatewayError):
                await self._write(record, payload)
        else:
            await self._write(record, payload)
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
