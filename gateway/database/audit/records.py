"""The audit log's writes: chain-linked appends of request records and admin events,
verification of both chains and the payloads, and the retention purge of payload text."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from gateway.database.audit.chain import EVENT_FIELDS, RECORD_FIELDS, ChainWalker, link
from gateway.database.audit.types import (
    AdminEvent,
    AuditUnavailable,
    Payload,
    RequestRecord,
    sha256_text,
)
from gateway.database.base import RECORDS_LOCK, StoreBase, chain_head, utcnow
from gateway.database.tables import EVENTS, PAYLOADS, RECORDS

_VERIFY_PAGE = 2000


def record_row(record: RequestRecord, payload: Payload | None, now: datetime) -> dict[str, Any]:
    """Column values of one record (chain fields not yet set). With a payload, missing
    prompt/completion digests are filled from it; given ones must match it."""
    if payload is not None:
        digests = {
            "prompt_sha256": sha256_text(payload.prompt),
            "completion_sha256": sha256_text(payload.completion),
        }
        for name, digest in digests.items():
            given = getattr(record, name)
            if given is not None and given != digest:
                raise ValueError(f"{name} does not match the payload text")
        record = dataclasses.replace(record, **digests)  # type: ignore[arg-type]
    row = {name: getattr(record, name) for name in RECORD_FIELDS}
    row["created_at"] = record.created_at or now
    row["reason_codes"] = list(record.reason_codes)
    if record.tool_names is not None:
        row["tool_names"] = list(record.tool_names)
    for name in ("temperature", "top_p", "latency_ms", "ttft_ms"):
        if row[name] is not None:
            row[name] = float(row[name])
    return row


def _append(conn: Connection, rows: list[dict[str, Any]], texts: list[Payload | None]) -> list[int]:
    """`rows` linked onto the records' chain and inserted, with their payload texts, in the
    caller's write transaction; their ids."""
    prev = chain_head(conn, RECORDS.c.id, RECORDS.c.record_hash)
    for row in rows:
        row["prev_hash"] = prev
        row["record_hash"] = prev = link(row, RECORD_FIELDS, prev)
    stmt = insert(RECORDS).returning(RECORDS.c.id, sort_by_parameter_order=True)
    ids = [int(r[0]) for r in conn.execute(stmt, rows)]
    payloads = [
        {
            "record_id": rid,
            "prompt": p.prompt,
            "completion": p.completion,
            "retention_days": p.retention_days,
            "expires_at": row["created_at"] + timedelta(days=p.retention_days),
        }
        for rid, row, p in zip(ids, rows, texts, strict=True)
        if p is not None
    ]
    if payloads:
        conn.execute(insert(PAYLOADS), payloads)
    return ids


class AuditMixin(StoreBase):
    """Appends, verification and purge of the audit chain (part of Database)."""

    # -- appends ---------------------------------------------------------------------------

    async def append(self, records: Sequence[tuple[RequestRecord, Payload | None]]) -> list[int]:
        """Append records in ONE transaction, chain-linked in order; durable on return.
        Returns their ids. Raises ValueError for invalid input, AuditUnavailable otherwise."""
        if not records:
            return []
        now = utcnow()
        rows = [record_row(r, p, now) for r, p in records]
        texts = [p for _, p in records]
        try:
            return await self._transact(lambda conn: _append(conn, rows, texts), RECORDS_LOCK)
        except (SQLAlchemyError, OSError) as exc:
            raise AuditUnavailable(f"audit append failed: {exc}") from exc

    async def append_admin(self, event: AdminEvent) -> int:
        """Append one admin event to its own chain; durable on return."""
        try:
            async with self._write() as conn:
                return await self._append_event(conn, event)
        except (SQLAlchemyError, OSError) as exc:
            raise AuditUnavailable(f"admin event append failed: {exc}") from exc

    # -- verification and purge ------------------------------------------------------------

    async def verify(self) -> dict[str, Any]:
        """Walk both chains and the surviving payloads.

        Returns ``{"ok", "checked", "first_broken", "head"}`` for ``audit_records`` (the id of
        the first record whose stored fields or link no longer match), plus the same shape
        under ``"admin_events"`` and ``"payloads"`` (``first_broken`` = record id whose
        payload text no longer matches its chained digest). Top-level ``ok`` is the AND of
        all three. Purged payloads do not break anything: the chain covers digests only.
        """
        records = await self._walk(RECORDS, RECORD_FIELDS)
        events = await self._walk(EVENTS, EVENT_FIELDS)
        payloads = await self._check_payloads()
        return {
            **records,
            "ok": records["ok"] and events["ok"] and payloads["ok"],
            "records_ok": records["ok"],
            "admin_events": events,
            "payloads": payloads,
        }

    async def _walk(self, table: Any, fields: tuple[str, ...]) -> dict[str, Any]:
        walker = ChainWalker(fields)
        last = 0
        async with self._read() as conn:
            while True:
                stmt = select(table).where(table.c.id > last).order_by(table.c.id)
                page = (await conn.execute(stmt.limit(_VERIFY_PAGE))).mappings().all()
                for row in page:
                    walker.feed(row)
                if len(page) < _VERIFY_PAGE:
                    return walker.result()
                last = page[-1]["id"]

    async def _check_payloads(self) -> dict[str, Any]:
        checked, first_broken, last = 0, None, 0
        cols = (
            PAYLOADS.c.record_id,
            PAYLOADS.c.prompt,
            PAYLOADS.c.completion,
            RECORDS.c.prompt_sha256,
            RECORDS.c.completion_sha256,
        )
        async with self._read() as conn:
            while True:
                stmt = (
                    select(*cols)
                    .join(RECORDS, RECORDS.c.id == PAYLOADS.c.record_id)
                    .where(PAYLOADS.c.record_id > last)
                    .order_by(PAYLOADS.c.record_id)
                    .limit(_VERIFY_PAGE)
                )
                page = (await conn.execute(stmt)).all()
                for rid, prompt, completion, p_sha, c_sha in page:
                    checked += 1
                    ok = sha256_text(prompt) == p_sha and sha256_text(completion) == c_sha
                    if not ok and first_broken is None:
                        first_broken = int(rid)
                if len(page) < _VERIFY_PAGE:
                    break
                last = page[-1][0]
        return {"ok": first_broken is None, "checked": checked, "first_broken": first_broken}

    async def purge_payloads(self, now: datetime | None = None) -> int:
        """Delete payloads whose ``expires_at`` <= ``now``; returns how many. The only
        deletion path of the audit data."""
        cutoff = now or utcnow()
        async with self._write() as conn:
            result = await conn.execute(delete(PAYLOADS).where(PAYLOADS.c.expires_at <= cutoff))
        return int(result.rowcount)
