"""Admission records (revision 0005_admission_records) on both backends: their own chain,
append-only, linked from the final record; verify names the admissions no final record
completes; tampering with either the admission or the link is caught."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from gateway.database import Admission, AuditWriter, Database, Payload, RecordFilter, RequestRecord

MakeRecord = Callable[..., RequestRecord]


def admission(i: int = 0, **overrides: Any) -> Admission:
    fields: dict[str, Any] = {
        "request_id": f"req-{i}", "tenant_id": "acme", "key_id": "key_1",
        "endpoint": "/v1/chat/completions", "decision_id": f"dec-{i}", "mode": "speculative",
        "proposer": "draft", "reason_codes": ["alpha_above_c"], "policy_revision": "rev1",
        "target_model": "tgt", "target_version": "1", "target_sha256": "a" * 64,
        "draft_model": "drf", "draft_version": "1", "draft_sha256": "b" * 64,
        "prompt_tokens": 12, "prompt_sha256": "c" * 64,
    }  # fmt: skip
    return Admission(**{**fields, **overrides})


async def test_admissions_chain_and_complete(store: Database, make_record: MakeRecord) -> None:
    writer = AuditWriter(store)
    await writer.start()
    try:
        ids = [await writer.write(admission(i)) for i in range(3)]
        for i in (0, 2):  # request 1's final record never comes
            rec = dataclasses.replace(make_record(i), admission_id=ids[i])
            await writer.write(rec, Payload("p", "c", 1) if i == 0 else None)
    finally:
        await writer.stop()
    report = await store.verify()
    assert report["ok"] and report["checked"] == 2
    assert report["admissions"] == {
        "ok": True, "checked": 3, "first_broken": None, "head": report["admissions"]["head"]
    }  # fmt: skip
    assert report["incomplete"] == {"count": 1, "request_ids": ["req-1"]}
    (left,) = await store.incomplete_admissions()
    assert left["id"] == ids[1] and left["prompt_sha256"] == "c" * 64
    assert await store.incomplete_admissions(tenant_id="other") == []
    listed, _ = await store.records(RecordFilter())
    assert sorted(r["admission_id"] for r in listed) == [ids[0], ids[2]]  # one row a request


async def test_mixed_batch_keeps_order_and_ids(store: Database, make_record: MakeRecord) -> None:
    """One group-commit transaction with both kinds: each chain in order, ids as given."""
    out = await store.append([(admission(0), None), (make_record(5), None), (admission(1), None)])
    assert out[0] < out[2]  # the admissions' own ids
    report = await store.verify()
    assert report["ok"] and report["admissions"]["checked"] == 2 and report["checked"] == 1
    with pytest.raises(ValueError, match="no payload"):
        await store.append([(admission(2), Payload("p", "c", 1))])


async def test_tampered_admission_or_link_is_caught(
    store: Database, make_record: MakeRecord
) -> None:
    ids = [(await store.append([(admission(i), None)]))[0] for i in range(3)]
    (rid,) = await store.append([(dataclasses.replace(make_record(0), admission_id=ids[0]), None)])
    if store.is_sqlite:
        await _sql(
            store, "DROP TRIGGER audit_admissions_no_update", "DROP TRIGGER audit_records_no_update"
        )
    async with store.engine.connect() as conn:
        if not store.is_sqlite:  # a superuser bypassing the triggers; the chain still tells
            await conn.execute(text("SET session_replication_role = replica"))
        await conn.execute(
            text("UPDATE audit_admissions SET prompt_sha256 = :d WHERE id = :i"),
            {"d": "0" * 64, "i": ids[1]},
        )
        await conn.execute(  # point the final record at another admission
            text("UPDATE audit_records SET admission_id = :a WHERE id = :i"),
            {"a": ids[2], "i": rid},
        )
        await conn.commit()
    report = await store.verify()
    assert report["ok"] is False
    assert report["admissions"]["first_broken"] == ids[1]
    assert report["first_broken"] == rid


async def test_admissions_are_append_only(store: Database) -> None:
    await store.append([(admission(0), None)])
    stmts = ["UPDATE audit_admissions SET tenant_id = 'x'", "DELETE FROM audit_admissions"]
    if not store.is_sqlite:
        stmts.append("TRUNCATE audit_admissions")
    for stmt in stmts:
        with pytest.raises(DBAPIError, match="append-only"):
            await _sql(store, stmt)


async def _sql(store: Database, *stmts: str) -> None:
    async with store.engine.connect() as conn:
        for stmt in stmts:
            await conn.execute(text(stmt))
        await conn.commit()
