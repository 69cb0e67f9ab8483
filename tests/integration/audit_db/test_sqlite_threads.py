"""On a SQLite file the request path's database work (audit appends, acceptance history,
key lookups) runs on the store's own two threads with plain connections
(gateway/database/base.py `SqliteThread`), beside the async engine's other writes."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from sqlalchemy import insert, select

from gateway.database import AdminEvent, AuditUnavailable, Database
from gateway.database.base import utcnow
from gateway.database.tables import TENANTS
from tests.integration.audit_db.conftest import record


def _threads() -> set[str]:
    return {t.name.rsplit("_", 1)[0] for t in threading.enumerate() if t.name.startswith("gw-")}


@pytest.fixture
async def file_store(tmp_path: Path) -> Database:
    return await Database.connect(f"sqlite+aiosqlite:///{tmp_path}/a.db", upgrade=True)


async def test_request_path_work_runs_on_the_stores_threads_beside_async_writes_and_verifies(
    file_store: Database,
) -> None:
    store = file_store
    await store.create_tenant("acme", "Acme")
    key_id, key = await store.create_key("acme", "tenant")

    async def appender(i: int) -> list[int]:
        return await store.append([(record(i, request_id=f"r{i}"), None)])

    async def history(i: int) -> None:
        await store.put_acceptance(
            "acme", "draft", "v1", ewma_acceptance=i / 40, ewma_c=0.1, samples=i
        )

    async def event(i: int) -> int:  # the async engine's path, interleaved
        return await store.append_admin(AdminEvent(actor="ops", action="x", subject=str(i)))

    got = await asyncio.gather(
        *(appender(i) for i in range(20)), *(history(i) for i in range(20)),
        *(event(i) for i in range(10)), *(store.lookup_key(key) for _ in range(10)),
    )  # fmt: skip
    assert {"gw-sqlite-writer", "gw-sqlite-reader"} <= _threads()
    ids = [i for ids in got[:20] for i in ids]  # type: ignore[union-attr]
    assert sorted(ids) == list(range(1, 21))
    assert all(info is not None and info.id == key_id for info in got[50:])
    checked = await store.verify()
    assert checked["ok"], checked
    assert checked["checked"] == 20 and checked["admin_events"]["checked"] >= 10
    row = await store.get_acceptance("acme", "draft", "v1")
    assert row is not None and row["samples"] in range(20)
    await store.close()
    assert not _threads() & {"gw-sqlite-writer", "gw-sqlite-reader"}


async def test_a_transaction_that_raises_on_the_writer_thread_leaves_nothing(
    file_store: Database,
) -> None:
    store = file_store

    def body(conn: object) -> None:
        conn.execute(insert(TENANTS).values(id="t", name="t", created_at=utcnow()))  # type: ignore[attr-defined]
        raise RuntimeError("after the insert")

    with pytest.raises(RuntimeError):
        await store._transact(body)  # type: ignore[arg-type]
    rows = await store._query(lambda conn: conn.execute(select(TENANTS.c.id)).all())
    assert rows == []
    await store.close()


async def test_a_closed_store_refuses_as_a_database_failure_and_closes_once(
    file_store: Database,
) -> None:
    await file_store.close()
    await file_store.close()
    with pytest.raises(AuditUnavailable):  # fail-closed, as any other database failure
        await file_store.append([(record(0), None)])


async def test_a_cancelled_writer_holds_the_write_lock_until_its_transaction_ends(
    file_store: Database,
) -> None:
    store = file_store
    started, release = threading.Event(), threading.Event()

    def slow(conn: object) -> None:
        conn.execute(insert(TENANTS).values(id="slow", name="s", created_at=utcnow()))  # type: ignore[attr-defined]
        started.set()
        release.wait(5)

    task = asyncio.create_task(store._transact(slow))  # type: ignore[arg-type]
    assert await asyncio.to_thread(started.wait, 5)
    task.cancel()
    await asyncio.sleep(0.05)
    assert store._write_lock.locked()  # this process's writers stay one at a time
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not store._write_lock.locked()
    rows = await store._query(lambda conn: conn.execute(select(TENANTS.c.id)).all())
    assert [r[0] for r in rows] == ["slow"]  # it committed
    await store.close()
