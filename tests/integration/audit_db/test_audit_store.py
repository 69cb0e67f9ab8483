"""Append, chain verification, tamper evidence and payload purge on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from gateway.database import AdminEvent, Database, Payload, RequestRecord, sha256_text
from gateway.database.audit.chain import RECORD_FIELDS, format_datetime

MakeRecord = Callable[..., RequestRecord]


async def _sql(store: Database, *statements: str) -> None:
    async with store.engine.connect() as conn:
        for stmt in statements:
            await conn.execute(text(stmt))
        await conn.commit()


async def test_append_round_trips_every_field_and_chains(
    store: Database, make_record: MakeRecord
) -> None:
    recs = [make_record(i, reason_codes=[f"r{i}", "x"], temperature=1) for i in range(5)]
    ids = await store.append([(r, None) for r in recs])
    assert ids == sorted(ids) and len(set(ids)) == 5
    more = await store.append([(make_record(9, mode=None, status=403, proposer=None), None)])
    assert more[0] > ids[-1]
    for rid, rec in zip(ids, recs, strict=True):
        got = await store.record(rid)
        assert got is not None
        for name in RECORD_FIELDS:
            want = getattr(rec, name)
            if name == "created_at":
                want = format_datetime(want)
            elif name == "reason_codes":
                want = list(want)
            assert got[name] == want, name
        assert got["temperature"] == 1.0 and isinstance(got["temperature"], float)
    heads = [(await store.record(i))["record_hash"] for i in ids]  # type: ignore[index]
    assert (await store.record(ids[1]))["prev_hash"] == heads[0]  # type: ignore[index]
    report = await store.verify()
    assert report["ok"] and report["checked"] == 6 and report["first_broken"] is None


async def test_empty_store_verifies(store: Database) -> None:
    report = await store.verify()
    assert report == {**report, "ok": True, "checked": 0, "first_broken": None}


async def test_payload_digests_are_filled_and_must_match(
    store: Database, make_record: MakeRecord, t0: datetime
) -> None:
    (rid,) = await store.append([(make_record(), Payload("hello", "world", 7))])
    got = await store.record(rid)
    assert got is not None and got["prompt_sha256"] == sha256_text("hello")
    assert got["payload"]["prompt"] == "hello"
    assert got["payload"]["expires_at"] == format_datetime(t0 + timedelta(days=7))
    with pytest.raises(ValueError, match="prompt_sha256"):
        await store.append([(make_record(prompt_sha256="0" * 64), Payload("a", "b", 1))])


async def test_payload_text_with_nul_round_trips(store: Database, make_record: MakeRecord) -> None:
    """A model can emit byte 0; PostgreSQL text cannot hold it. The payload must still be
    written and read back exactly, with its digest valid."""
    prompt, completion = "a\x00b \u2400 c\u24000", "\x00\u2400\x00\u2400\u2400"
    (rid,) = await store.append([(make_record(), Payload(prompt, completion, 7))])
    got = await store.record(rid)
    assert got is not None
    assert got["payload"]["prompt"] == prompt and got["payload"]["completion"] == completion
    assert (await store.verify())["ok"]


async def test_tampered_field_names_first_broken_record(
    store: Database, make_record: MakeRecord
) -> None:
    ids = await store.append([(make_record(i), None) for i in range(6)])
    if store.is_sqlite:
        await _sql(store, "DROP TRIGGER audit_records_no_update")
    async with store.engine.connect() as conn:
        if not store.is_sqlite:  # a superuser bypassing the triggers; the chain still tells
            await conn.execute(text("SET session_replication_role = replica"))
        await conn.execute(
            text("UPDATE audit_records SET accepted_tokens = 1 WHERE id = :i"), {"i": ids[3]}
        )
        await conn.execute(
            text("UPDATE audit_records SET status = 500 WHERE id = :i"), {"i": ids[4]}
        )
        await conn.commit()
    report = await store.verify()
    assert report["ok"] is False and report["records_ok"] is False
    assert report["first_broken"] == ids[3] and report["checked"] == 6


async def test_deleted_record_breaks_the_next_link(
    store: Database, make_record: MakeRecord
) -> None:
    if not store.is_sqlite:
        pytest.skip("PostgreSQL refuses DELETE (see test_triggers_refuse_changes)")
    ids = await store.append([(make_record(i), None) for i in range(4)])
    await _sql(
        store,
        "DROP TRIGGER audit_records_no_delete",
        f"DELETE FROM audit_records WHERE id = {ids[1]}",
    )
    report = await store.verify()
    assert report["first_broken"] == ids[2]


async def test_triggers_refuse_changes(store: Database, make_record: MakeRecord) -> None:
    await store.append([(make_record(i), None) for i in range(3)])
    await store.append_admin(AdminEvent("ops", "tenant.created", "acme", None, {"id": "acme"}))
    if store.is_sqlite:  # defence in depth; SQLite has no TRUNCATE
        for stmt in ("UPDATE audit_records SET status = 500", "DELETE FROM admin_events"):
            with pytest.raises(DBAPIError, match="append-only"):
                await _sql(store, stmt)
        return
    for stmt in (
        "UPDATE audit_records SET status = 500",
        "DELETE FROM audit_records",
        "TRUNCATE audit_records CASCADE",
        "UPDATE admin_events SET actor = 'x'",
        "DELETE FROM admin_events",
        "TRUNCATE admin_events",
    ):
        with pytest.raises(DBAPIError, match="append-only"):
            await _sql(store, stmt)
    report = await store.verify()
    assert report["ok"] and report["checked"] == 3 and report["admin_events"]["checked"] == 1


async def test_purge_deletes_expired_payloads_and_chain_stays_valid(
    store: Database, make_record: MakeRecord, t0: datetime
) -> None:
    batch = [
        (make_record(0), Payload("p0", "c0", 1)),
        (make_record(1), Payload("p1", "c1", 30)),
        (make_record(2), None),
        (make_record(3), Payload("p3", "c3", 0)),
    ]
    ids = await store.append(batch)
    assert await store.purge_payloads(now=t0 + timedelta(days=2)) == 2
    assert (await store.record(ids[0]))["payload"] is None  # type: ignore[index]
    assert (await store.record(ids[1]))["payload"]["prompt"] == "p1"  # type: ignore[index]
    assert (await store.record(ids[3]))["payload"] is None  # type: ignore[index]
    report = await store.verify()
    assert report["ok"] and report["checked"] == 4 and report["payloads"]["checked"] == 1
    assert await store.purge_payloads(now=t0 + timedelta(days=2)) == 0


async def test_tampered_payload_is_reported(store: Database, make_record: MakeRecord) -> None:
    ids = await store.append([(make_record(i), Payload(f"p{i}", "c", 5)) for i in range(3)])
    await _sql(store, f"UPDATE audit_payloads SET completion = 'forged' WHERE record_id = {ids[1]}")
    report = await store.verify()
    assert report["records_ok"] and not report["ok"]
    assert report["payloads"]["first_broken"] == ids[1]


async def test_admin_events_chain_and_tamper(store: Database) -> None:
    ids = [
        await store.append_admin(
            AdminEvent("ops", "key.created", f"k{i}", None, {"n": i, "f": 0.5})
        )
        for i in range(4)
    ]
    events, cursor = await store.events(limit=3)
    assert [e["id"] for e in events] == ids[::-1][:3] and cursor is not None
    rest, end = await store.events(cursor=cursor, limit=3)
    assert [e["id"] for e in rest] == ids[:1] and end is None
    assert (await store.verify())["admin_events"] == {
        "ok": True,
        "checked": 4,
        "first_broken": None,
        "head": events[0]["record_hash"],
    }
    if store.is_sqlite:
        await _sql(
            store,
            "DROP TRIGGER admin_events_no_update",
            f"UPDATE admin_events SET subject = 'kX' WHERE id = {ids[2]}",
        )
        report = await store.verify()
        assert not report["ok"] and report["records_ok"]
        assert report["admin_events"]["first_broken"] == ids[2]
