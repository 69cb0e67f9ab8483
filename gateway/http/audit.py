"""Compliance API: the admin key reads everything, an auditor key its own tenant only,
tenant inference keys get 403."""

from __future__ import annotations

import re
from collections.abc import Awaitable
from datetime import datetime
from typing import Annotated, Any, TypeVar

from litestar import Request, get
from litestar.di import Provide
from litestar.params import Parameter
from litestar.response import Stream
from sqlalchemy.exc import SQLAlchemyError

from gateway.database import RecordFilter, sha256_text
from gateway.database.audit.queries import decode_cursor
from gateway.http.audit_query import (
    MAX_PAGE,
    STATUS_CODES,
    Cursor,
    FilterQuery,
    Format,
    Limit,
    Since,
    Until,
)
from gateway.limits import INT64_MAX
from gateway.serving import Services
from gateway.serving.commands import Principal
from gateway.serving.errors import GatewayError, invalid

T = TypeVar("T")


def _svc(request: Request[Any, Any, Any]) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


_DIGITS = re.compile(r"[0-9]{1,19}")
"""An integer as a query value: ASCII digits only (str.isdigit takes '²', int() does not)."""


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise invalid(f"{name} must be an ISO 8601 timestamp, got '{value}'", name) from None
    if parsed.tzinfo is None:
        raise invalid(f"{name} must carry a timezone (e.g. 2026-12-01T00:00:00Z)", name)
    return parsed


def _filter(q: FilterQuery, who: Principal) -> RecordFilter:
    tenant = q.tenant
    if who.tenant_id is not None:  # a tenant auditor key
        if tenant not in (None, who.tenant_id):
            raise GatewayError(
                "permission",
                "an auditor key reads its own tenant only",
                param="tenant",
                code="forbidden",
            )
        tenant = who.tenant_id
    status = q.status
    low, high = STATUS_CODES
    if status is not None and not (_DIGITS.fullmatch(status) and low <= int(status) <= high):
        raise invalid("status must be an HTTP status code", "status")
    return RecordFilter(
        tenant_id=tenant,
        since=_time(q.since, "since"),
        until=_time(q.until, "until"),
        mode=q.mode,
        target_model=q.target_model,
        target_version=q.target_version,
        draft_model=q.draft_model,
        draft_version=q.draft_version,
        status=int(status) if status else None,
        decision_id=q.decision_id,
        user_sha256=sha256_text(q.user) if q.user is not None else None,
        trace_id=q.trace_id.lower() if q.trace_id is not None else None,
    )


def _cursor(raw: str | None) -> str | None:
    """A page cursor as the listings (newest first) issued it, checked before any query: a
    malformed one, or one whose id no database column holds, is a 400 naming cursor."""
    if raw is None:
        return None
    try:
        after = decode_cursor(raw, "desc")
    except ValueError as exc:
        raise invalid(str(exc), "cursor") from None
    if not 0 <= after <= INT64_MAX:
        raise invalid("invalid cursor", "cursor")
    return raw


def _limit(raw: str) -> int:
    if not _DIGITS.fullmatch(raw) or not 1 <= int(raw) <= MAX_PAGE:
        raise invalid(f"limit must be an integer in [1, {MAX_PAGE}]", "limit")
    return int(raw)


async def _answered(query: Awaitable[T]) -> T:
    """The query's answer, or 503 ``audit_unavailable`` when the database refuses it: down,
    or past its lock or statement limit (``GATEWAY_DATABASE_*_TIMEOUT_MS``), rather than a
    500. A streamed export has sent its status by then: a failure there ends the stream."""
    try:
        return await query
    except SQLAlchemyError as exc:
        raise GatewayError(
            "unavailable",
            "the audit store did not answer (down, or the query ran past its time limit); "
            "retry shortly, or narrow the query with since/until",
            code="audit_unavailable",
            retry_after=2,
        ) from exc


async def _who(request: Request[Any, Any, Any]) -> Principal:
    return await _svc(request).auth.auditor(request.headers.get("authorization"))


FILTERS = {"filters": Provide(FilterQuery, sync_to_thread=False)}


@get("/audit/records", summary="Audit records (filters, cursor pagination)", dependencies=FILTERS)
async def records(
    request: Request[Any, Any, Any],
    filters: FilterQuery,
    cursor: Cursor = None,
    limit: Limit = "100",
) -> dict[str, Any]:
    who = await _who(request)
    store = _svc(request).store
    rows, nxt = await _answered(
        store.records(_filter(filters, who), _cursor(cursor), _limit(limit))
    )
    return {"data": rows, "next_cursor": nxt}


RecordId = Annotated[
    int,
    Parameter(
        ge=1,
        le=INT64_MAX,
        description="The record's id (its `id` in the list).",
        schema_extra={"maximum": INT64_MAX, "minimum": 1},  # exact: Litestar writes floats
    ),
]


@get("/audit/records/{record_id:int}", summary="One audit record")
async def record(request: Request[Any, Any, Any], record_id: RecordId) -> dict[str, Any]:
    who = await _who(request)
    row = await _answered(
        _svc(request).store.record(record_id, who.tenant_id if who.role == "auditor" else None)
    )
    if row is None:
        raise GatewayError("not_found", f"no audit record {record_id}", code="not_found")
    return row


@get(
    "/audit/export",
    summary="Export records as JSON lines or CSV (streamed)",
    dependencies=FILTERS,
)
async def export(
    request: Request[Any, Any, Any], filters: FilterQuery, fmt: Format = "jsonl"
) -> Stream:
    who = await _who(request)
    if fmt not in ("jsonl", "csv"):
        raise invalid("format must be jsonl or csv", "format")
    f = _filter(filters, who)
    media = "application/x-ndjson" if fmt == "jsonl" else "text/csv"
    chunks = _svc(request).store.export(f, fmt)  # type: ignore[arg-type]
    return Stream(
        chunks,
        media_type=media,
        headers={"content-disposition": f'attachment; filename="audit.{fmt}"'},
    )


@get(
    "/audit/summary",
    summary="Requests, tokens and acceptance by day x tenant x mode x model",
    dependencies=FILTERS,
)
async def summary(request: Request[Any, Any, Any], filters: FilterQuery) -> dict[str, Any]:
    who = await _who(request)
    return {"data": await _answered(_svc(request).store.summary(_filter(filters, who)))}


@get("/audit/events", summary="Admin events (tenants, keys, policies, rollouts)")
async def events(
    request: Request[Any, Any, Any],
    since: Since = None,
    until: Until = None,
    cursor: Cursor = None,
    limit: Limit = "100",
) -> dict[str, Any]:
    who = await _who(request)
    if who.tenant_id is not None:
        raise GatewayError(
            "permission",
            "admin events are readable by operators (admin, auditor) only",
            code="forbidden",
        )
    rows, nxt = await _answered(
        _svc(request).store.events(
            since=_time(since, "since"),
            until=_time(until, "until"),
            cursor=_cursor(cursor),
            limit=_limit(limit),
        )
    )
    return {"data": rows, "next_cursor": nxt}


@get("/audit/verify", summary="Verify the hash chain of the audit tables")
async def verify(request: Request[Any, Any, Any]) -> dict[str, Any]:
    await _who(request)
    return await _answered(_svc(request).store.verify())


ROUTES = [records, record, export, summary, events, verify]
