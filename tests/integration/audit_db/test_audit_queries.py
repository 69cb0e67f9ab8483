"""Filters, cursor pagination, export, summary and tenant scoping on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from gateway.database import Database, RecordFilter, RequestRecord
from gateway.database.audit.chain import RECORD_FIELDS, link

MakeRecord = Callable[..., RequestRecord]


@pytest.fixture
async def seeded(store: Database, make_record: MakeRecord, t0: datetime) -> list[int]:
    """12 records: tenants acme/globex alternate; every third standard; one refused."""
    recs = []
    for i in range(12):
        tenant = "acme" if i % 2 == 0 else "globex"
        if i % 3 == 0:
            rec = make_record(
                i, tenant_id=tenant, mode="standard", proposer=None, draft_model=None,
                draft_version=None, draft_sha256=None, drafted_tokens=0, accepted_tokens=0,
            )  # fmt: skip
        else:
            rec = make_record(i, tenant_id=tenant, draft_version="2" if i > 6 else "1")
        recs.append(rec)
    recs[11] = make_record(
        11, tenant_id="globex", created_at=t0 + timedelta(days=1), status=429, mode=None,
        proposer=None, drafted_tokens=0, accepted_tokens=0, completion_tokens=0,
        error_type="rate_limit_exceeded",
    )  # fmt: skip
    return await store.append([(r, None) for r in recs])


async def _all_pages(store: Database, f: RecordFilter, limit: int, oldest: bool) -> list[int]:
    seen, cursor = [], None
    while True:
        rows, cursor = await store.records(f, cursor, limit, oldest_first=oldest)
        seen += [r["id"] for r in rows]
        assert len(rows) <= limit
        if cursor is None:
            return seen


async def test_cursor_pagination_visits_each_record_once(
    store: Database, seeded: list[int]
) -> None:
    assert await _all_pages(store, RecordFilter(), 5, oldest=False) == seeded[::-1]
    assert await _all_pages(store, RecordFilter(), 5, oldest=True) == seeded
    acme = await _all_pages(store, RecordFilter(tenant_id="acme"), 2, oldest=False)
    assert acme == seeded[::2][::-1]
    rows, cursor = await store.records(RecordFilter(), None, 12)
    assert len(rows) == 12 and cursor is None


async def test_bad_cursors_are_rejected(store: Database, seeded: list[int]) -> None:
    _, cursor = await store.records(RecordFilter(), None, 2)
    assert cursor is not None
    with pytest.raises(ValueError, match="other order"):
        await store.records(RecordFilter(), cursor, 2, oldest_first=True)
    with pytest.raises(ValueError, match="invalid cursor"):
        await store.records(RecordFilter(), "not-a-cursor!", 2)


async def test_filters(store: Database, seeded: list[int], t0: datetime) -> None:
    async def ids(**kw: object) -> list[int]:
        rows, _ = await store.records(RecordFilter(**kw), None, 100, oldest_first=True)  # type: ignore[arg-type]
        return [r["id"] for r in rows]

    assert await ids(mode="standard") == [seeded[i] for i in (0, 3, 6, 9)]
    assert await ids(status=429) == [seeded[11]]
    assert await ids(draft_version="2", mode="speculative") == [seeded[i] for i in (7, 8, 10)]
    assert await ids(since=t0 + timedelta(minutes=2), until=t0 + timedelta(minutes=4)) == [
        seeded[2],
        seeded[3],
    ]
    assert await ids(decision_id="dec-5") == [seeded[5]]
    assert await ids(tenant_id="globex", target_model="tgt", target_version="1") == seeded[1::2]
    assert await ids(draft_model="nope") == []


async def test_record_is_scoped_to_the_callers_tenant(store: Database, seeded: list[int]) -> None:
    acme_id, globex_id = seeded[0], seeded[1]
    assert (await store.record(acme_id, tenant_id="acme")) is not None
    assert (await store.record(globex_id, tenant_id="acme")) is None
    assert (await store.record(globex_id))["tenant_id"] == "globex"  # type: ignore[index]
    assert await store.record(10**9) is None


async def test_export_jsonl_is_rehashable_and_csv_matches(
    store: Database, seeded: list[int]
) -> None:
    lines = [line async for line in store.export(RecordFilter(), "jsonl", page_size=5)]
    rows = [json.loads(line) for line in lines]
    assert [r["id"] for r in rows] == seeded and all(line.endswith("\n") for line in lines)
    # a third party can re-verify an export: created_at is already in the chain's format
    for row in rows:
        assert link(row, RECORD_FIELDS, row["prev_hash"]) == row["record_hash"]
    text = "".join([line async for line in store.export(RecordFilter(tenant_id="acme"), "csv")])
    table = list(csv.DictReader(io.StringIO(text)))
    assert [int(r["id"]) for r in table] == seeded[::2]
    assert json.loads(table[0]["reason_codes"]) == ["alpha_above_c"]
    assert table[0]["record_hash"] == rows[0]["record_hash"]
    pages: list[int] = []
    exported = [
        line
        async for line in store.export(RecordFilter(), "jsonl", page_size=5, progress=pages.append)
    ]
    assert len(exported) == 12 and pages == [5, 10, 12]


async def test_export_of_empty_store(store: Database) -> None:
    assert [line async for line in store.export(RecordFilter(), "jsonl")] == []
    csv_lines = [line async for line in store.export(RecordFilter(), "csv")]
    assert len(csv_lines) == 1 and csv_lines[0].startswith("id,request_id")


async def test_summary_numbers(store: Database, seeded: list[int], t0: datetime) -> None:
    rows = await store.summary(RecordFilter(tenant_id="acme"))
    by_key = {(r["day"], r["mode"], r["draft_version"]): r for r in rows}
    day = t0.strftime("%Y-%m-%d")
    spec_v1 = by_key[(day, "speculative", "1")]  # acme speculative: i = 2, 4 (v1), 8, 10 (v2)
    assert spec_v1["requests"] == 2 and spec_v1["drafted_tokens"] == 20
    assert spec_v1["accepted_tokens"] == 14 and spec_v1["acceptance_rate"] == pytest.approx(0.7)
    assert spec_v1["prompt_tokens"] == 40 and spec_v1["completion_tokens"] == 18
    assert spec_v1["mean_latency_ms"] == pytest.approx(12.5) and spec_v1["errors"] == 0
    std = by_key[(day, "standard", None)]  # i = 0, 6
    assert std["requests"] == 2 and std["acceptance_rate"] is None
    assert sum(r["requests"] for r in rows) == 6
    globex = await store.summary(RecordFilter(tenant_id="globex"))
    refused = [r for r in globex if r["mode"] is None]
    assert len(refused) == 1 and refused[0]["errors"] == 1
    assert refused[0]["day"] == (t0 + timedelta(days=1)).strftime("%Y-%m-%d")
