"""Query parameters of the compliance API, declared so that OpenAPI lists each one.

Litestar takes every value as the string that was sent; `audit._filter` / `audit._limit`
parse them after the caller is authenticated, so a bad value is a 400 in OpenAI's shape
naming the parameter. ``schema_extra`` documents the form the parser accepts."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar.openapi.spec import OpenAPIFormat, OpenAPIType
from litestar.params import Parameter


def _query(
    description: str,
    query: str | None = None,
    type: OpenAPIType = OpenAPIType.STRING,
    **schema: Any,
) -> Any:
    """A documented query parameter: its schema is the value's form, not ``str | None``."""
    extra = {"one_of": None, "type": type, **schema}
    return Parameter(description=description, query=query, schema_extra=extra)


TIMESTAMP = {"format": OpenAPIFormat.DATE_TIME}
MAX_PAGE = 1000
"""Largest page of /audit/records and /audit/events."""
STATUS_CODES = (100, 599)
"""The HTTP status codes a record may hold (the status filter's range)."""
Since = Annotated[
    str | None, _query("Records at or after this ISO 8601 time (with a timezone).", **TIMESTAMP)
]
Until = Annotated[
    str | None, _query("Records before this ISO 8601 time (with a timezone).", **TIMESTAMP)
]
Cursor = Annotated[str | None, _query("The previous page's next_cursor.")]
Limit = Annotated[
    str,
    _query(
        f"Page size, an integer in [1, {MAX_PAGE}].",
        type=OpenAPIType.INTEGER,
        minimum=1,
        maximum=MAX_PAGE,
        default=100,
    ),
]
Format = Annotated[
    str, _query("Export format: jsonl (JSON lines) or csv.", "format", enum=["jsonl", "csv"])
]


class FilterQuery(msgspec.Struct, frozen=True, kw_only=True):
    """The record filters of /audit/records, /audit/export and /audit/summary as sent
    (strings), parsed by `audit._filter`. Litestar builds it as a dependency from the query
    string, one documented parameter per field."""

    since: Since = None
    until: Until = None
    tenant: Annotated[
        str | None, _query("Tenant id (an auditor key reads its own tenant only).")
    ] = None
    mode: Annotated[str | None, _query("Decoding mode that served it (speculative, standard).")] = (
        None
    )
    target_model: Annotated[str | None, _query("Target model name.")] = None
    target_version: Annotated[str | None, _query("Target model version.")] = None
    draft_model: Annotated[str | None, _query("Draft model name.")] = None
    draft_version: Annotated[str | None, _query("Draft model version.")] = None
    status: Annotated[
        str | None,
        _query(
            "HTTP status code of the response.",
            type=OpenAPIType.INTEGER,
            minimum=STATUS_CODES[0],
            maximum=STATUS_CODES[1],
        ),
    ] = None
    decision_id: Annotated[str | None, _query("The policy decision's id.")] = None
    user: Annotated[
        str | None,
        _query("The request's end-user id (OpenAI's user); matched through its SHA-256."),
    ] = None
    trace_id: Annotated[
        str | None, _query("The request's OpenTelemetry trace id (32 hex digits).")
    ] = None
