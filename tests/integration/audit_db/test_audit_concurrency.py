"""Two OS processes appending to one database keep one valid chain; the writer fails closed
when the database disappears."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text

from gateway.database import AuditUnavailable, AuditWriter, Database, RecordFilter, RequestRecord
from tests.pg import admin_engine, fresh_database

ROOT = Path(__file__).resolve().parents[3]
PER_PROCESS = 300
WORKER = """
import asyncio, pathlib, sys, time
from gateway.database import Database, AuditWriter, RequestRecord

async def main(url, tag, n, go):
    store = await Database.connect(url)
    writer = AuditWriter(store, max_batch=16)
    await writer.start()
    while not pathlib.Path(go).exists():
        time.sleep(0.01)

    async def lane(lane_no):
        for j in range(lane_no, n, 6):
            rec = RequestRecord(request_id=f"{tag}-{j}", endpoint="/v1/completions",
                                status=200, tenant_id=tag, latency_ms=j / 3)
            if j % 50 == 0:
                await store.append([(rec, None)])  # direct appends interleave with batches
            else:
                await writer.write(rec)

    await asyncio.gather(*(lane(i) for i in range(6)))
    await writer.stop()
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
"""


async def _two_writers(url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", WORKER, url, tag, str(PER_PROCESS), str(go), env=env, cwd=ROOT
        )
        for tag in ("alpha", "beta")
    ]
    await asyncio.sleep(1.0)  # both started and connected (imports take a moment)
    go.write_text("go")
    codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 300)
    assert codes == [0, 0]


async def test_two_processes_keep_one_valid_chain(db_url: str, tmp_path: Path) -> None:
    setup = await Database.connect(db_url, upgrade=True)
    await setup.close()
    await _two_writers(db_url, tmp_path)
    store = await Database.connect(db_url)
    try:
        report = await store.verify()
        assert report["ok"] and report["checked"] == 2 * PER_PROCESS
        rows = [line async for line in store.export(RecordFilter(), "jsonl")]
        tags = [('"tenant_id":"alpha"' in line) for line in rows]
        switches = sum(a != b for a, b in itertools.pairwise(tags))
        assert switches >= 2, "the two processes never interleaved: test proves nothing"
        for tag in ("alpha", "beta"):
            got, _ = await store.records(RecordFilter(tenant_id=tag), None, 1000)
            assert sorted(r["request_id"] for r in got) == sorted(
                f"{tag}-{j}" for j in range(PER_PROCESS)
            )
    finally:
        await store.close()


async def test_writer_batches_on_both_backends(
    store: Database, make_record: Callable[..., RequestRecord]
) -> None:
    writer = AuditWriter(store, max_batch=32)
    await writer.start()
    ids = await asyncio.gather(*(writer.write(make_record(i)) for i in range(150)))
    queued = [asyncio.create_task(writer.write(make_record(i))) for i in range(150, 190)]
    await asyncio.sleep(0)
    await writer.stop()
    assert all(t.done() and not t.exception() for t in queued)
    assert len(set(ids) | {t.result() for t in queued}) == 190
    assert writer.stats.transactions < 190 / 4 and writer.stats.records == 190
    report = await store.verify()
    assert report["ok"] and report["checked"] == 190


@pytest.mark.postgres
async def test_dropped_postgres_database_fails_closed(
    make_record: Callable[..., RequestRecord],
) -> None:
    async with fresh_database("gone") as url:
        store = await Database.connect(url, upgrade=True)
        writer = AuditWriter(store)
        await writer.start()
        assert await writer.write(make_record(0)) >= 1
        admin = admin_engine()
        name = url.rsplit("/", 1)[1]
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        await admin.dispose()
        with pytest.raises(AuditUnavailable):
            await writer.write(make_record(1))
        await writer.stop()
        await store.close()
