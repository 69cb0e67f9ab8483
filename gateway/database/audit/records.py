"""The audit log's writes: chain-linked appends of admissions, request records and admin
events, verification of the three chains and the payloads (and of which admissions no final
record completes), and the retention purge of payload text."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from gateway.database.audit.chain import (
    ADMISSION_FIELDS,
    EVENT_FIELDS,
    RECORD_FIELDS,
    ChainWalker,
    link,
)
from gateway.database.audit.types import (
    AdminEvent,
    Admission,
    AuditUnavailable,
    Payload,
    RequestRecord,
    sha256_text,
)
from gateway.database.base import RECORDS_LOCK, StoreBase, chain_head, utcnow
from gateway.database.tables_audit import ADMISSIONS, EVENTS, PAYLOADS, RECORDS

_VERIFY_PAGE = 2000
_INCOMPLETE_LISTED = 20
"""How many incomplete admissions ``verify`` names (oldest first); it counts them all."""
Entry = RequestRecord | Admission
"""What an append takes: a final record (with its payload, if any) or an admission."""


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
            # + 0.0 turns -0.0 into 0.0: SQLite stores -0.0 as 0.0, so a request sent with
            # "temperature": -0.0 would otherwise hash one value and read back another,
            # and the chain would read as broken from that record on.
            row[name] = float(row[name]) + 0.0
    return row


def admission_row(admission: Admission, now: datetime) -> dict[str, Any]:
    """Column values of one admission (chain fields not yet set)."""
    row = {name: getattr(admission, name) for name in ADMISSION_FIELDS}
    row["created_at"] = admission.created_at or now
    row["reason_codes"] = list(admission.reason_codes)
    return row


def entry_row(entry: Entry, payload: Payload | None, now: datetime) -> dict[str, Any]:
    """Column values of a record or an admission; ValueError when invalid (an admission
    carries no payload: the final record keeps the texts)."""
    if isinstance(entry, Admission):
        if payload is not None:
            raise ValueError("an admission carries no payload")
        return admission_row(entry, now)
    return record_row(entry, payload, now)


def _link_rows(conn: Connection, table: Any, fields: tuple[str, ...], rows: list[Any]) -> None:
    if not rows:  # no round trip for the chain a batch does not touch
        return
    prev = chain_head(conn, table.c.id, table.c.record_hash)
    for row in rows:
        row["prev_hash"] = prev
        row["record_hash"] = prev = link(row, fields, prev)


def _insert(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> list[int]:
    if not rows:
        return []
    stmt = insert(table).returning(table.c.id, sort_by_parameter_order=True)
    return [int(r[0]) for r in conn.execute(stmt, rows)]


def _append(
    conn: Connection, rows: list[dict[str, Any]], texts: list[Payload | None],
    admitted: list[bool] | None = None,
) -> list[int]:  # fmt: skip
    """`rows` linked onto their chains (``admitted[i]``: row i is an admission) and inserted,
    records with their payload texts, in the caller's write transaction; their ids, in the
    order given."""
    admitted = admitted or [False] * len(rows)
    adm_rows = [row for row, a in zip(rows, admitted, strict=True) if a]
    rec_rows = [row for row, a in zip(rows, admitted, strict=True) if not a]
    rec_texts = [t for t, a in zip(texts, admitted, strict=True) if not a]
    _link_rows(conn, ADMISSIONS, ADMISSION_FIELDS, adm_rows)
    adm_ids = _insert(conn, ADMISSIONS, adm_rows)
    _link_rows(conn, RECORDS, RECORD_FIELDS, rec_rows)
    rec_ids = _insert(conn, RECORDS, rec_rows)
    payloads = [
        {
            "record_id": rid,
            "prompt": p.prompt,
            "completion": p.completion,
            "retention_days": p.retention_days,
            "expires_at": row["created_at"] + timedelta(days=p.retention_days),
        }
        for rid, row, p in zip(rec_ids, rec_rows, rec_texts, strict=True)
        if p is not None
    ]
    if payloads:
        conn.execute(insert(PAYLOADS), payloads)
    adm_iter, rec_iter = iter(adm_ids), iter(rec_ids)
    return [next(adm_iter) if a else next(rec_iter) for a in admitted]


def _incomplete() -> Any:
    """SELECT of the admissions no final record names in ``admission_id``."""
    done = select(RECORDS.c.id).where(RECORDS.c.admission_id == ADMISSIONS.c.id)
    return select(ADMISSIONS).where(~done.exists())


class AuditMixin(StoreBase):
    """Appends, verification and purge of the audit chain (part of Database)."""

    # -- appends ---------------------------------------------------------------------------

    async def append(self, records: Sequence[tuple[Entry, Payload | None]]) -> list[int]:
        """Append records and admissions in ONE transaction, each chain-linked in order (an
        admission on the admissions' chain); durable on return. Returns their ids (an
        admission's is its ``audit_admissions`` id). Raises ValueError for invalid input,
        AuditUnavailable otherwise."""
        if not records:
            return []
        now = utcnow()
        rows = [entry_row(r, p, now) for r, p in records]
        texts = [p for _, p in records]
        admitted = [isinstance(r, Admission) for r, _ in records]
        try:
            return await self._transact(
                lambda conn: _append(conn, rows, texts, admitted), RECORDS_LOCK
            )
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
        """Walk the three chains and the surviving payloads.

        Returns ``{"ok", "checked", "first_broken", "head"}`` for ``audit_records`` (the id of
        the first record whose stored fields or link no longer match), plus the same shape
        under ``"admin_events"``, ``"admissions"`` and ``"payloads"`` (``first_broken`` =
        record id whose payload text no longer matches its chained digest). Top-level ``ok``
        is the AND of all four. Purged payloads do not break anything: the chain covers
        digests only.

        ``"incomplete"``: the admissions no final record completes, ``{"count",
        "request_ids"}`` (the oldest 20): requests that were served or started without a
        final record (its write failed, or the process died), and those still running.
        They do not make ``ok`` false: the chains are intact; the records are incomplete.
        """
        records = await self._walk(RECORDS, RECORD_FIELDS)
        events = await self._walk(EVENTS, EVENT_FIELDS)
        admissions = await self._walk(ADMISSIONS, ADMISSION_FIELDS)
        payloads = await self._check_payloads()
        ok = records["ok"] and events["ok"] and admissions["ok"] and payloads["ok"]
        return {
            **records,
            "ok": ok,
            "records_ok": records["ok"],
            "admin_events": events,
            "admissions": admissions,
            "payloads": payloads,
            "incomplete": await self._incomplete_summary(),
        }

    async def incomplete_admissions(
        self, limit: int = 100, tenant_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Admissions (oldest first) that no final record completes: each a request that was
        admitted (and may have been served) whose final record is missing."""
        stmt = _incomplete().order_by(ADMISSIONS.c.id).limit(max(1, limit))
        if tenant_id is not None:
            stmt = stmt.where(ADMISSIONS.c.tenant_id == tenant_id)
        async with self._read() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings()]

    async def _incomplete_summary(self) -> dict[str, Any]:
        sub = _incomplete().subquery()
        async with self._read() as conn:
            count = (await conn.execute(select(func.count()).select_from(sub))).scalar_one()
            first = await conn.execute(
                select(sub.c.request_id).order_by(sub.c.id).limit(_INCOMPLETE_LISTED)
            )
            return {"count": int(count), "request_ids": [str(r[0]) for r in first]}

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
