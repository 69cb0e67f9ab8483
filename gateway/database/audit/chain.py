"""Hash chain: canonical encoding and SHA-256 links for audit records and admin events.

Three chains: ``audit_records`` (one final record per request), ``audit_admissions`` (a
served request's admission, before its first output byte; the final record names it in
``admission_id``) and ``admin_events``. In each,
``record_hash = sha256(canonical(fields, prev_hash))`` where ``canonical`` is the UTF-8 of
``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)`` over every stored
field except ``id`` and ``record_hash`` (``prev_hash`` included). Fixed formats:

- datetimes: UTC, ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (always six fraction digits);
- floats (float columns are coerced to float first): Python's shortest round-trip ``repr``
  as a JSON number, e.g. ``1.0``, ``0.7``; NaN and infinities are refused;
- ints, strings, null, JSON lists/objects as ``json`` writes them;
- the fields added later (``HASHED_WHEN_SET``) are left out while null.

Ids are not hashed; chain order is id order. The first link's ``prev_hash`` is 64 zeros.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import RowMapping

GENESIS = "0" * 64

RECORD_FIELDS: tuple[str, ...] = (
    "request_id", "decision_id", "tenant_id", "key_id", "created_at", "endpoint", "status",
    "error_type", "requested_mode", "mode", "reason_codes", "policy_revision", "target_model",
    "target_version", "target_sha256", "proposer", "draft_model", "draft_version",
    "draft_sha256", "k_min", "k_max", "drafted_tokens", "accepted_tokens", "temperature",
    "top_p", "top_k", "seed", "constraint", "constraint_sha256", "prompt_tokens",
    "completion_tokens", "latency_ms", "ttft_ms", "prompt_sha256", "completion_sha256",
    "user_sha256", "tool_calls", "tool_names", "trace_id", "admission_id", "reasoning_tokens",
)  # fmt: skip
"""Hashed fields of ``audit_records`` (besides ``prev_hash``)."""

HASHED_WHEN_SET = frozenset(
    {"user_sha256", "tool_calls", "tool_names", "trace_id", "admission_id", "reasoning_tokens"}
)
"""Fields added after revision 0001: hashed only when not null, so records written before
the columns existed keep their hashes. ``trace_id`` (revision 0004_trace_id) is hashed when
set, so the link from a record to its trace is as tamper-evident as the record; so is
``admission_id`` (revision 0005_admission_records), the link from a final record to the
admission it completes; so is ``reasoning_tokens`` (revision 0007_reasoning_tokens)."""

ADMISSION_FIELDS: tuple[str, ...] = (
    "request_id", "tenant_id", "key_id", "endpoint", "created_at", "decision_id", "mode",
    "proposer", "reason_codes", "policy_revision", "target_model", "target_version",
    "target_sha256", "draft_model", "draft_version", "draft_sha256", "prompt_tokens",
    "prompt_sha256", "trace_id",
)  # fmt: skip
"""Hashed fields of ``audit_admissions`` (besides ``prev_hash``): its own chain, written
before a request's first output byte; the same canonical encoding as the records'."""

EVENT_FIELDS: tuple[str, ...] = ("actor", "action", "subject", "before", "after", "created_at")
"""Hashed fields of ``admin_events`` (besides ``prev_hash``)."""

FLOAT_FIELDS = frozenset({"temperature", "top_p", "latency_ms", "ttft_ms"})


def format_datetime(value: datetime) -> str:
    """The one datetime format of the chain and of exports."""
    if value.utcoffset() is None:
        raise ValueError("naive datetime in hashed field")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _normalize(name: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, datetime):
        return format_datetime(value)
    if name in FLOAT_FIELDS:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite")
        return value
    if name in ("reason_codes", "tool_names"):
        return list(value)
    return value


def canonical(row: Mapping[str, Any] | RowMapping, fields: Iterable[str], prev_hash: str) -> bytes:
    """Canonical bytes of one chained row (see module docstring)."""
    obj = {
        name: _normalize(name, row[name])
        for name in fields
        if not (name in HASHED_WHEN_SET and row[name] is None)
    }
    obj["prev_hash"] = prev_hash
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return text.encode("utf-8")


def link(row: Mapping[str, Any] | RowMapping, fields: Iterable[str], prev_hash: str) -> str:
    """``record_hash`` of ``row`` chained after ``prev_hash``."""
    return hashlib.sha256(canonical(row, fields, prev_hash)).hexdigest()


class ChainWalker:
    """Checks rows in id order; remembers the first id whose link no longer holds."""

    def __init__(self, fields: Iterable[str]) -> None:
        self.fields = tuple(fields)
        self.prev = GENESIS
        self.checked = 0
        self.first_broken: int | None = None

    def feed(self, row: Mapping[str, Any] | RowMapping) -> None:
        self.checked += 1
        expected = link(row, self.fields, row["prev_hash"])
        if self.first_broken is None and (
            row["prev_hash"] != self.prev or row["record_hash"] != expected
        ):
            self.first_broken = int(row["id"])
        self.prev = row["record_hash"]

    def result(self) -> dict[str, Any]:
        return {
            "ok": self.first_broken is None,
            "checked": self.checked,
            "first_broken": self.first_broken,
            "head": None if self.checked == 0 else self.prev,
        }
