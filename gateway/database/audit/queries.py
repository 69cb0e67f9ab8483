"""Compliance queries: filtered listing with cursors, one record, streamed export, summary,
admin events.

Cursors are opaque strings (URL-safe base64 of ``{"after": last_id, "order": ...}``). Listings
are newest first by default (``oldest_first=True`` flips it); a cursor only continues the
listing order it came from. Exports run oldest first and stop at the newest id present when
the export began, so a long export is a consistent prefix of the chain.
"""

from __future__ import annotations

import base64
import csv
import io
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import ColumnElement, and_, case, func, select
from sqlalchemy.engine import RowMapping

from gateway.database.audit.chain import format_datetime
from gateway.database.audit.types import RecordFilter
from gateway.database.base import StoreBase
from gateway.database.tables_audit import EVENTS, PAYLOADS, RECORDS

RECORD_COLUMNS: tuple[str, ...] = tuple(c.name for c in RECORDS.columns)
"""Column order of exports (CSV header)."""
MAX_LIMIT = 1000
_EQUALITY = (
    "tenant_id",
    "mode",
    "target_model",
    "target_version",
    "draft_model",
    "draft_version",
    "status",
    "decision_id",
    "user_sha256",
    "trace_id",
)
_GROUP = (
    "tenant_id",
    "mode",
    "proposer",
    "target_model",
    "target_version",
    "draft_model",
    "draft_version",
)


def encode_cursor(after: int, order: str) -> str:
    raw = json.dumps({"after": after, "order": order}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, order: str) -> int:
    """The last id seen; ValueError for a malformed cursor or one from the other order."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        obj = json.loads(base64.urlsafe_b64decode(padded.encode()))
        after, cursor_order = int(obj["after"]), obj["order"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError("invalid cursor") from exc
    if cursor_order != order:
        raise ValueError("cursor belongs to a listing in the other order")
    return after


def record_filter_clause(f: RecordFilter) -> list[ColumnElement[bool]]:
    conds: list[ColumnElement[bool]] = [
        RECORDS.c[name] == getattr(f, name) for name in _EQUALITY if getattr(f, name) is not None
    ]
    if f.since is not None:
        conds.append(RECORDS.c.created_at >= f.since)
    if f.until is not None:
        conds.append(RECORDS.c.created_at < f.until)
    return conds


def to_json_ready(row: RowMapping | dict[str, Any]) -> dict[str, Any]:
    """Row -> dict of JSON-ready values (datetimes in the chain's format)."""
    return {k: format_datetime(v) if isinstance(v, datetime) else v for k, v in row.items()}


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
"""First characters that make a spreadsheet read a cell as a formula (OWASP, CSV
injection): a tenant's model name such as ``=HYPERLINK(...)`` must reach an auditor's
spreadsheet as text."""


def csv_cell(value: Any) -> Any:
    """One CSV cell: None empty, lists and objects as JSON, and text that a spreadsheet would
    run as a formula prefixed with a single quote (numbers stay numbers: ``-1.5`` is data)."""
    if value is None:
        return ""
    if isinstance(value, list | dict):
        value = json.dumps(value)
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def csv_line(values: list[Any]) -> str:
    """One CSV line (``\\n`` ended) of escaped cells (:func:`csv_cell`)."""
    buf = io.StringIO()
    # "\r\n" as the writer's terminator makes it quote a cell holding either character (with
    # "\n" alone a carriage return went out unquoted and split the row); lines end in "\n"
    csv.writer(buf, lineterminator="\r\n").writerow([csv_cell(v) for v in values])
    return buf.getvalue()[:-2] + "\n"


class QueryMixin(StoreBase):
    async def records(
        self,
        f: RecordFilter,
        cursor: str | None = None,
        limit: int = 100,
        *,
        oldest_first: bool = False,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of records matching ``f`` and the cursor of the next page (None at the
        end). Newest first unless ``oldest_first``. ``limit`` is clamped to 1..1000."""
        order = "asc" if oldest_first else "desc"
        after = decode_cursor(cursor, order) if cursor else None
        limit = max(1, min(limit, MAX_LIMIT))
        rows = await self._record_page(f, after, limit + 1, oldest_first)
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = encode_cursor(rows[-1]["id"], order) if more else None
        return rows, nxt

    async def _record_page(
        self,
        f: RecordFilter,
        after: int | None,
        limit: int,
        ascending: bool,
        upper: int | None = None,
    ) -> list[dict[str, Any]]:
        conds = record_filter_clause(f)
        if after is not None:
            conds.append(RECORDS.c.id > after if ascending else RECORDS.c.id < after)
        if upper is not None:
            conds.append(RECORDS.c.id <= upper)
        order = RECORDS.c.id.asc() if ascending else RECORDS.c.id.desc()
        stmt = select(RECORDS).where(and_(True, *conds)).order_by(order).limit(limit)
        async with self._read() as conn:
            result = await conn.execute(stmt)
            return [to_json_ready(r) for r in result.mappings()]

    async def record(self, id: int, tenant_id: str | None = None) -> dict[str, Any] | None:
        """One record with its ``payload`` (None when not stored or purged). With
        ``tenant_id`` (a tenant key's scope) another tenant's record reads as None."""
        conds = [RECORDS.c.id == id]
        if tenant_id is not None:
            conds.append(RECORDS.c.tenant_id == tenant_id)
        async with self._read() as conn:
            row = (await conn.execute(select(RECORDS).where(*conds))).mappings().first()
            if row is None:
                return None
            pay_cols = [c for c in PAYLOADS.c if c.name != "record_id"]
            pay = (
                (await conn.execute(select(*pay_cols).where(PAYLOADS.c.record_id == id)))
                .mappings()
                .first()
            )
        out = to_json_ready(row)
        out["payload"] = None if pay is None else to_json_ready(pay)
        return out

    async def export(
        self,
        f: RecordFilter,
        fmt: Literal["jsonl", "csv"],
        *,
        page_size: int = 500,
        progress: Callable[[int], None] | None = None,
    ) -> AsyncIterator[str]:
        """Stream matching records oldest first, one line per item (CSV starts with its
        header). Pages of ``page_size``; ``progress(rows_so_far)`` after each page."""
        if fmt not in ("jsonl", "csv"):
            raise ValueError(f"unknown export format {fmt!r}")
        async with self._read() as conn:
            upper = (await conn.execute(select(func.max(RECORDS.c.id)))).scalar()
        if fmt == "csv":
            yield csv_line(list(RECORD_COLUMNS))
        if upper is None:
            return
        after, done = 0, 0
        while True:
            page = await self._record_page(f, after, page_size, True, upper)
            for row in page:
                if fmt == "jsonl":
                    yield json.dumps(row, separators=(",", ":"), ensure_ascii=False) + "\n"
                else:
                    yield csv_line([row[c] for c in RECORD_COLUMNS])
            done += len(page)
            if progress is not None:
                progress(done)
            if len(page) < page_size:
                return
            after = page[-1]["id"]

    async def summary(self, f: RecordFilter) -> list[dict[str, Any]]:
        """Per UTC day x tenant x mode x proposer x target/draft model+version: requests,
        errors (status >= 400), token sums, acceptance_rate (accepted / drafted, None when
        nothing was drafted) and mean latency. Sorted by day, then the group keys."""
        if self.is_sqlite:
            day = func.strftime("%Y-%m-%d", RECORDS.c.created_at)
        else:
            day = func.to_char(func.timezone("UTC", RECORDS.c.created_at), "YYYY-MM-DD")
        keys = [day.label("day"), *(RECORDS.c[k] for k in _GROUP)]
        stmt = (
            select(
                *keys,
                func.count().label("requests"),
                func.sum(case((RECORDS.c.status >= 400, 1), else_=0)).label("errors"),
                func.sum(RECORDS.c.prompt_tokens).label("prompt_tokens"),
                func.sum(RECORDS.c.completion_tokens).label("completion_tokens"),
                func.sum(RECORDS.c.drafted_tokens).label("drafted_tokens"),
                func.sum(RECORDS.c.accepted_tokens).label("accepted_tokens"),
                func.avg(RECORDS.c.latency_ms).label("mean_latency_ms"),
            )
            .where(and_(True, *record_filter_clause(f)))
            .group_by(*keys)
        )
        async with self._read() as conn:
            rows = [dict(r) for r in (await conn.execute(stmt)).mappings()]
        for row in rows:
            for k in ("requests", "errors", "prompt_tokens", "completion_tokens"):
                row[k] = int(row[k] or 0)
            drafted, accepted = int(row["drafted_tokens"] or 0), int(row["accepted_tokens"] or 0)
            row["drafted_tokens"], row["accepted_tokens"] = drafted, accepted
            row["acceptance_rate"] = accepted / drafted if drafted else None
            mean = row["mean_latency_ms"]
            row["mean_latency_ms"] = None if mean is None else float(mean)
        rows.sort(key=lambda r: [r["day"], *((r[k] is not None, r[k] or "") for k in _GROUP)])
        return rows

    async def events(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        cursor: str | None = None,
        limit: int = 100,
        *,
        action: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Admin events newest first (``since`` inclusive, ``until`` exclusive), paged by
        cursor like :meth:`records`."""
        conds: list[ColumnElement[bool]] = []
        if since is not None:
            conds.append(EVENTS.c.created_at >= since)
        if until is not None:
            conds.append(EVENTS.c.created_at < until)
        if action is not None:
            conds.append(EVENTS.c.action == action)
        if cursor:
            conds.append(EVENTS.c.id < decode_cursor(cursor, "desc"))
        limit = max(1, min(limit, MAX_LIMIT))
        stmt = select(EVENTS).where(and_(True, *conds)).order_by(EVENTS.c.id.desc())
        async with self._read() as conn:
            result = await conn.execute(stmt.limit(limit + 1))
            rows = [to_json_ready(r) for r in result.mappings()]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, encode_cursor(rows[-1]["id"], "desc") if more else None
