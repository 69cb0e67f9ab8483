"""AuditWriter group commit, with a fake store (exact transaction accounting) and SQLite."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from gateway.database import (
    AuditUnavailable,
    AuditWriter,
    Database,
    Payload,
    RecordFilter,
    RequestRecord,
)


def rec(i: int, **kw: object) -> RequestRecord:
    return RequestRecord(request_id=f"r{i}", endpoint="/v1/completions", status=200, **kw)  # type: ignore[arg-type]


class FakeStore:
    """Records each append call (= one transaction); can fail on demand."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[str]] = []
        self.delay = delay
        self.fail_with: BaseException | None = None
        self.poison: str | None = None
        self.next_id = 1

    async def append(self, records: Sequence[tuple[RequestRecord, Payload | None]]) -> list[int]:
        await asyncio.sleep(self.delay)
        names = [r.request_id for r, _ in records]
        if self.fail_with is not None:
            raise self.fail_with
        if self.poison in names:
            err = IntegrityError("INSERT", {}, Exception("unique"))
            raise AuditUnavailable("bad row") from err
        self.batches.append(names)
        ids = list(range(self.next_id, self.next_id + len(records)))
        self.next_id += len(records)
        return ids


async def _writer(store: object, **kw: int) -> AuditWriter:
    writer = AuditWriter(store, **kw)  # type: ignore[arg-type]
    await writer.start()
    return writer


async def test_concurrent_writes_share_transactions() -> None:
    store = FakeStore(delay=0.002)
    writer = await _writer(store, max_batch=64)
    ids = await asyncio.gather(*(writer.write(rec(i)) for i in range(200)))
    await writer.stop()
    assert sorted(ids) == list(range(1, 201))
    assert sum(len(b) for b in store.batches) == 200
    assert len(store.batches) <= 8 and max(len(b) for b in store.batches) == 64
    assert writer.stats.transactions == len(store.batches) and writer.stats.records == 200
    order = [name for b in store.batches for name in b]
    assert order == [f"r{i}" for i in range(200)]  # FIFO: chain order = arrival order


async def test_lone_writer_does_not_linger() -> None:
    store = FakeStore()
    writer = await _writer(store, max_delay_ms=500)
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(5):
        await writer.write(rec(i))
    assert loop.time() - start < 0.4
    await writer.stop()
    assert store.batches == [[f"r{i}"] for i in range(5)]


async def test_stop_flushes_everything_queued() -> None:
    store = FakeStore(delay=0.01)
    writer = await _writer(store, max_batch=8)
    tasks = [asyncio.create_task(writer.write(rec(i))) for i in range(50)]
    await asyncio.sleep(0)  # queued, mostly not yet committed
    await writer.stop()
    assert all(t.done() for t in tasks)
    assert sorted(t.result() for t in tasks) == list(range(1, 51))
    with pytest.raises(AuditUnavailable):
        await writer.write(rec(99))


async def test_failure_fails_every_waiter_closed() -> None:
    store = FakeStore()
    store.fail_with = AuditUnavailable("disk gone")
    writer = await _writer(store)
    results = await asyncio.gather(
        *(writer.write(rec(i)) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, AuditUnavailable) for r in results)
    store.fail_with = RuntimeError("bug")
    with pytest.raises(AuditUnavailable):
        await writer.write(rec(7))
    store.fail_with = None
    assert await writer.write(rec(8)) == 1  # the writer survives failures
    await writer.stop()
    assert writer.stats.failures == 2


async def test_one_bad_row_fails_alone() -> None:
    store = FakeStore(delay=0.001)
    store.poison = "r3"
    writer = await _writer(store)
    results = await asyncio.gather(
        *(writer.write(rec(i)) for i in range(6)), return_exceptions=True
    )
    await writer.stop()
    assert isinstance(results[3], AuditUnavailable)
    assert all(isinstance(r, int) for i, r in enumerate(results) if i != 3)


async def test_invalid_record_is_refused_before_queueing() -> None:
    writer = await _writer(FakeStore())
    with pytest.raises(ValueError):
        await writer.write(rec(1, prompt_sha256="0" * 64), Payload("p", "c", 1))
    await writer.stop()


async def test_write_before_start_is_refused() -> None:
    with pytest.raises(AuditUnavailable):
        await AuditWriter(FakeStore()).write(rec(1))  # type: ignore[arg-type]


async def test_sqlite_writer_batches_and_persists(tmp_path: Path) -> None:
    store = await Database.connect(f"sqlite+aiosqlite:///{tmp_path}/a.db", upgrade=True)
    writer = await _writer(store, max_batch=32)
    ids = await asyncio.gather(
        *(writer.write(rec(i), Payload(f"p{i}", "c", 1) if i % 2 else None) for i in range(100))
    )
    await writer.stop()
    assert len(set(ids)) == 100 and writer.stats.transactions < 100
    rows, _ = await store.records(RecordFilter(), None, 1000)
    assert len(rows) == 100
    report = await store.verify()
    assert report["ok"] and report["checked"] == 100 and report["payloads"]["checked"] == 50
    await store.close()


async def test_missing_directory_fails_closed(tmp_path: Path) -> None:
    store = await Database.connect(f"sqlite+aiosqlite:///{tmp_path}/missing/dir/a.db")
    writer = await _writer(store)
    with pytest.raises(AuditUnavailable) as info:
        await writer.write(rec(1))
    assert isinstance(info.value.__cause__, OperationalError)
    await writer.stop()
    await store.close()
    (tmp_path / "plain-file").write_text("")
    with pytest.raises(AuditUnavailable):
        await Database.connect(f"sqlite+aiosqlite:///{tmp_path}/plain-file/a.db", upgrade=True)


async def test_read_only_database_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    await (await Database.connect(f"sqlite+aiosqlite:///{path}", upgrade=True)).close()
    store = await Database.connect(f"sqlite+aiosqlite:///file:{path}?mode=ro&uri=true")
    writer = await _writer(store)
    with pytest.raises(AuditUnavailable, match="readonly"):
        await writer.write(rec(1))
    await writer.stop()
    await store.close()
