"""Writes each request's audit record (fail-closed), then feeds history and metrics.

The record is awaited: a completion is only returned after its record is durable. The
acceptance-history update and metric listeners run afterwards and off the critical path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.audit import AuditUnavailable, AuditWriter, Payload, RequestRecord
from gateway.serving.audit_map import refused_record, served_record
from gateway.serving.commands import Generate, Principal, RequestMeta
from gateway.serving.errors import STATUS_OF_KIND, GatewayError
from gateway.serving.outcome import Outcome

log = logging.getLogger("gateway.audit")
RETRY_AFTER_FAILURE_S = 2.0

Listener = Callable[[RequestRecord, Any], None]


class Recorder:
    def __init__(self, writer: AuditWriter, *, fail_closed: bool = True) -> None:
        self.writer = writer
        self.fail_closed = fail_closed
        self.listeners: list[Listener] = []
        self.after_served: list[Callable[[Any, Any], Coroutine[Any, Any, None]]] = []
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

    async def served(self, gen: Any, target: Any, draft: Any, plan: Any, outcome: Outcome) -> None:
        completion = "".join(gen.text_parts)
        record = served_record(
            meta=gen.meta,
            principal=gen.principal,
            cmd=gen.command,
            status=outcome.status,
            error=outcome.error,
            decision=gen.decision,
            target=target,
            draft=draft.entry if draft else None,
            prompt_text=gen.prompt_text,
            prompt_tokens=len(gen.prompt_ids),
            result=gen.result,
            completion_text=completion,
            first_token_at=gen.first_token_at,
        )
        payload = None
        if plan.retention_days > 0:
            payload = Payload(gen.prompt_text, completion, plan.retention_days)
        await self._write(record, payload)
        for listener in self.listeners:
            listener(record, gen.result)
        for hook in self.after_served:
            self.detach(hook(gen, plan))

    async def refused(
        self,
        principal: Principal | None,
        meta: RequestMeta,
        cmd: Generate | None,
        error: GatewayError,
    ) -> None:
        record = refused_record(meta, principal, cmd, STATUS_OF_KIND[error.kind], error)
        with contextlib.suppress(GatewayError):  # the client gets its original error
            await self._write(record, None)
        for listener in self.listeners:
            listener(record, None)

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
