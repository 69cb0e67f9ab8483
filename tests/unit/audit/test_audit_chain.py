"""Canonical encoding and hash links: pure functions, no database."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.database import Payload, RequestRecord
from gateway.database.audit.chain import (
    FLOAT_FIELDS,
    GENESIS,
    HASHED_WHEN_SET,
    RECORD_FIELDS,
    ChainWalker,
    canonical,
    link,
)
from gateway.database.audit.records import record_row

NOW = datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
BASE = RequestRecord(
    request_id="r1", endpoint="/v1/chat/completions", status=200, tenant_id="t", temperature=0.7
)


def row_of(rec: RequestRecord) -> dict[str, object]:
    return record_row(rec, None, NOW)


def test_canonical_is_sorted_compact_json_with_fixed_formats() -> None:
    data = json.loads(canonical(row_of(BASE), RECORD_FIELDS, GENESIS))
    assert list(data) == sorted(data)
    assert set(data) == {*RECORD_FIELDS, "prev_hash"} - HASHED_WHEN_SET
    assert data["created_at"] == "2025-01-02T03:04:05.000006Z"
    assert b", " not in canonical(row_of(BASE), RECORD_FIELDS, GENESIS)


def test_equal_instants_and_int_floats_hash_the_same() -> None:
    plus_two = timezone(timedelta(hours=2))
    a = dataclasses.replace(BASE, created_at=NOW, temperature=1)
    b = dataclasses.replace(BASE, created_at=NOW.astimezone(plus_two), temperature=1.0)
    assert link(row_of(a), RECORD_FIELDS, GENESIS) == link(row_of(b), RECORD_FIELDS, GENESIS)


def test_prev_hash_is_part_of_the_link() -> None:
    row = row_of(BASE)
    assert link(row, RECORD_FIELDS, GENESIS) != link(row, RECORD_FIELDS, "1" * 64)


@given(st.sampled_from([f for f in RECORD_FIELDS if f != "created_at"]), st.integers(1, 10**6))
def test_changing_any_hashed_field_changes_the_hash(name: str, n: int) -> None:
    row = row_of(BASE)
    before = link(row, RECORD_FIELDS, GENESIS)
    value = row[name]
    if name == "tool_names":
        changed: object = [*(value or []), str(n)]
    elif value is None:
        changed = float(n) if name in FLOAT_FIELDS else n
    elif isinstance(value, float):
        changed = value + n / 1e9
    elif isinstance(value, int):
        changed = value + n
    elif isinstance(value, list):
        changed = [*value, str(n)]
    else:
        changed = f"{value}{n}"
    assert link({**row, name: changed}, RECORD_FIELDS, GENESIS) != before


def test_fields_added_later_leave_older_hashes_alone() -> None:
    """A record written before revision 0002 (no user_sha256 / tool_calls / tool_names keys)
    hashes as the same record read back with those columns null; set, they are hashed."""
    row = row_of(BASE)
    old = {k: v for k, v in row.items() if k not in HASHED_WHEN_SET}
    old_fields = [f for f in RECORD_FIELDS if f not in HASHED_WHEN_SET]
    assert link(old, old_fields, GENESIS) == link(row, RECORD_FIELDS, GENESIS)
    tools = row_of(dataclasses.replace(BASE, tool_calls=1, tool_names=("add",)))
    data = json.loads(canonical(tools, RECORD_FIELDS, GENESIS))
    assert data["tool_calls"] == 1 and data["tool_names"] == ["add"]
    assert link(tools, RECORD_FIELDS, GENESIS) != link(row, RECORD_FIELDS, GENESIS)


def test_non_finite_and_naive_values_are_refused() -> None:
    with pytest.raises(ValueError):
        link({**row_of(BASE), "latency_ms": float("nan")}, RECORD_FIELDS, GENESIS)
    with pytest.raises(ValueError):
        link({**row_of(BASE), "created_at": datetime(2025, 1, 1)}, RECORD_FIELDS, GENESIS)


def test_walker_reports_first_broken_id() -> None:
    walker, prev, rows = ChainWalker(RECORD_FIELDS), GENESIS, []
    for i in range(1, 5):
        row = {**row_of(dataclasses.replace(BASE, request_id=f"r{i}")), "id": i, "prev_hash": prev}
        row["record_hash"] = prev = link(row, RECORD_FIELDS, row["prev_hash"])  # type: ignore[arg-type]
        rows.append(row)
    rows[2] = {**rows[2], "status": 500}
    for row in rows:
        walker.feed(row)
    assert walker.result()["first_broken"] == 3 and walker.result()["checked"] == 4


def test_record_validation() -> None:
    base = {"request_id": "r", "endpoint": "/v1/completions", "status": 200}
    bad_inputs: list[dict[str, object]] = [
        {"mode": "turbo"},
        {"status": 99},
        {"accepted_tokens": 2, "drafted_tokens": 1},
        {"proposer": "oracle"},
        {"created_at": datetime(2025, 1, 1)},
        {"reason_codes": "abc"},
    ]
    for bad in bad_inputs:
        with pytest.raises(ValueError):
            RequestRecord(**{**base, **bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Payload("p", "c", -1)
    rec = RequestRecord(**base)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.status = 500  # type: ignore[misc]
