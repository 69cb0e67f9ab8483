"""The checkpoint job on a real SQLite store: it signs when enough rows wait (not before),
works off a backlog in several transactions, appends each checkpoint to its file, and a
sink that fails leaves the checkpoint signed and stored, its failure in the status."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.database import AuditLog, Database, Signer
from gateway.database.audit import log_sign
from gateway.database.audit.log_export import export_log
from gateway.database.audit.verify_export import verify_export
from gateway.serving import checkpoints
from gateway.serving.checkpoints import CheckpointJob, FileSink, WitnessSink
from tests.integration.audit_db.conftest import record

KEY = Signer.generate("gw.test/audit")


async def _wait(predicate: object, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_the_job_signs_when_rows_wait_and_files_each_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "POLL_S", 0.1)
    store = await Database.connect(f"sqlite+aiosqlite:///{tmp_path}/g.db", upgrade=True)
    filed = tmp_path / "cps.txt"
    dead = WitnessSink("http://127.0.0.1:9/witness/add-checkpoint")  # nothing listens
    job = CheckpointJob(AuditLog(store, KEY), 3600, 5, [FileSink(str(filed)), dead])
    job.start()
    try:
        await store.append([(record(i), None) for i in range(3)])
        await asyncio.sleep(0.5)
        assert job.status.last is None  # 3 rows wait, fewer than 5, long before the hour
        await store.append([(record(i), None) for i in range(3, 6)])
        await _wait(lambda: job.status.last is not None)
        assert job.status.last["size"] == 7  # 6 records + the key's admin event
        assert job.status.sinks[f"file:{filed}"] == "appended"
        assert job.status.sinks[dead.name].startswith("failed:")
        lines = [x async for x in export_log(AuditLog(store))]
        report = verify_export(lines, filed.read_text(), [KEY.verifier])
        assert report["ok"] and report["verified_size"] == 7, report
    finally:
        await job.stop()
        await store.close()


async def test_a_backlog_is_signed_in_steps_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "POLL_S", 0.1)
    monkeypatch.setattr(checkpoints, "SEQUENCE_BATCH", 10)
    store = await Database.connect(f"sqlite+aiosqlite:///{tmp_path}/g.db", upgrade=True)
    await store.append([(record(i), None) for i in range(35)])
    log = AuditLog(store, KEY)
    real = log.checkpoint
    monkeypatch.setattr(log, "checkpoint", lambda: real(limit=10))
    job = CheckpointJob(log, 3600, 1, [])
    job.start()
    try:
        await _wait(lambda: job.status.last is not None and job.status.last["size"] == 36)
        sizes = [c["tree_size"] for c in await log.checkpoints()]
        assert sorted(sizes) == [10, 20, 30, 36]
    finally:
        await job.stop()
        await store.close()
    assert log_sign.SEQUENCE_BATCH >= 1000  # the real step is unchanged
