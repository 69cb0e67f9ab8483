"""Cost of the verifiable log (part of benchmarks/audit.py; ``python -m benchmarks.audit
--log`` runs this part alone and writes benchmarks/reports/audit_log.json).

- ``throughput``: audit records/s through AuditWriter (32 writers, the gateway's audit
  capacity) in alternating rounds on one database: with no checkpoints (``off``), beside
  the gateway's checkpoint job with its defaults (``job``: a checkpoint per 1000 rows or
  60 s), and beside a checkpoint every ``CHECKPOINT_EVERY_S`` (``stress``).
  ``ratio_job`` / ``ratio_stress`` = that mode / off (median rounds; goal >= 0.95). Each
  round starts from a log that holds every row written before it (the state of a
  gateway whose job keeps up: the rows an ``off`` round left are sequenced between
  rounds, untimed, as ``catch_up_s``), and a ``job`` or ``stress`` round ends by
  sequencing the rest of its own rows, inside its CPU time: each mode pays for exactly
  its own records' leaves. ``job_leaves_in_window``: the leaves the job had signed
  before the round's last write returned.
- ``proofs``: a log of 1,000,000 leaves (synthetic leaf hashes stored by the same
  ``append_leaves`` as the job's; the records themselves are not needed to prove) on a
  SQLite file: time to build it, an inclusion proof's time (through ``AuditLog.inclusion``,
  the API's path: leaf lookup, checkpoint, one node query) and a consistency proof's, and
  the proofs' sizes (hashes and bytes; log2(1e6) ~ 20).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert

from gateway.database import AuditLog, AuditWriter, Database, Signer
from gateway.database.audit import merkle
from gateway.database.audit.log_tables import CHECKPOINTS
from gateway.database.audit.log_tree import append_leaves, node_source
from gateway.serving.checkpoints import CheckpointJob

CHECKPOINT_EVERY_S = 0.5
KEY = Signer.generate("bench.local/audit")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def _catch_up(log: AuditLog) -> int:
    """Sequence and sign everything waiting (in SEQUENCE_BATCH steps); the leaves added."""
    added = 0
    while (signed := await log.checkpoint()) is not None:
        added += signed.appended
    return added


async def _writes(
    url: str, total: int, writers: int, mode: str, make: Any
) -> tuple[float, float, int | None]:
    """records/s for ``total`` records from ``writers`` lanes, beside: nothing (``off``),
    the gateway's checkpoint job with its default settings (``job``: 60 s or 1000 rows,
    looked at every 2 s), or a checkpoint every CHECKPOINT_EVERY_S (``stress``); this
    process's CPU milliseconds per 1000 records (steadier than wall time on a shared
    machine; PostgreSQL's own CPU is not in it), the leaves a job or stress round still
    owed included; and the leaves the job had signed when the last write returned."""
    store = await Database.connect(url)
    writer = AuditWriter(store, max_batch=64, max_delay_ms=5)
    await writer.start()
    log = AuditLog(store, KEY)
    start_size = await log.size()
    done = asyncio.Event()
    job = CheckpointJob(log, 60, 1000, []) if mode == "job" else None

    async def stress() -> None:
        while not done.is_set():
            await log.checkpoint()
            await asyncio.sleep(CHECKPOINT_EVERY_S)

    async def lane(n: int) -> None:
        for i in range(n, total, writers):
            await writer.write(make(i))

    task = asyncio.create_task(stress()) if mode == "stress" else None
    if job is not None:
        job.start()
    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(lane(n) for n in range(writers)))
    elapsed = time.perf_counter() - start
    in_window = None
    if job is not None:
        in_window = (job.status.last or {"size": start_size})["size"] - start_size
    done.set()
    if task is not None:
        await task
    if job is not None:
        await job.stop()
    if mode != "off":
        await _catch_up(log)  # the rest of this round's own rows: its share of the work
    cpu = time.process_time() - cpu
    await writer.stop()
    await store.close()
    return total / elapsed, cpu / total * 1e6, in_window


async def throughput(url: str, make: Any, total: int, rounds: int) -> dict[str, Any]:
    await (await Database.connect(url, upgrade=True)).close()
    rates: dict[str, list[float]] = {"off": [], "job": [], "stress": []}
    cpu: dict[str, list[float]] = {"off": [], "job": [], "stress": []}
    catch_up: list[tuple[float, int]] = []
    in_window: list[int | None] = []
    for _ in range(rounds):  # alternating, so drift on a shared machine hits all three
        for mode, seen in rates.items():
            store = await Database.connect(url)
            t0 = time.perf_counter()
            added = await _catch_up(AuditLog(store, KEY))  # untimed: what "off" left
            if mode == "job":  # after an "off" round
                catch_up.append((time.perf_counter() - t0, added))
            await store.close()
            rate, ms, leaves = await _writes(url, total, 32, mode, make)
            seen.append(rate)
            cpu[mode].append(ms)
            if mode == "job":
                in_window.append(leaves)
    store = await Database.connect(url)
    await _catch_up(AuditLog(store, KEY))
    checks = await store.verify()
    await store.close()
    off = statistics.median(rates["off"])
    return {
        **{f"records_per_s_{m}": [round(x, 1) for x in v] for m, v in rates.items()},
        **{f"cpu_ms_per_1000_{m}": [round(x, 1) for x in v] for m, v in cpu.items()},
        "cpu_ratio_job": round(statistics.median(cpu["job"]) / statistics.median(cpu["off"]), 3),
        "ratio_job": round(statistics.median(rates["job"]) / off, 3),
        "ratio_stress": round(statistics.median(rates["stress"]) / off, 3),
        "job_leaves_in_window": in_window,
        "catch_up_s": round(statistics.median(t for t, _ in catch_up), 3) if catch_up else None,
        "catch_up_leaves": statistics.median(n for _, n in catch_up) if catch_up else None,
        "chain_ok": checks["ok"],
    }


def _build(path: Path, n: int, chunk: int = 50_000) -> float:
    """A log of ``n`` synthetic leaves (kind record, source ids 1..n) and a checkpoint row
    of size n; returns the seconds it took."""
    engine = create_engine(f"sqlite:///{path}")
    t0 = time.perf_counter()
    size = 0
    with engine.begin() as conn:
        while size < n:
            k = min(chunk, n - size)
            leaves = [
                ("record", size + i + 1, hashlib.sha256(b"%d" % (size + i)).digest())
                for i in range(k)
            ]
            size = append_leaves(conn, size, leaves)
        root = merkle.root(n, node_source(conn))
        conn.execute(
            insert(CHECKPOINTS),
            {"tree_size": n, "root_hash": root.hex(), "key_id": "00000000",
             "note": "bench\n", "created_at": datetime.now(UTC)},
        )  # fmt: skip
    elapsed = time.perf_counter() - t0
    engine.dispose()
    return elapsed


def _consistency(conn: Any, first: int, n: int) -> list[bytes]:
    return merkle.consistency_proof(first, n, node_source(conn))


async def proofs(tmp: Path, n: int, samples: int = 300) -> dict[str, Any]:
    path = tmp / "proofs.db"
    url = f"sqlite+aiosqlite:///{path}"
    await (await Database.connect(url, upgrade=True)).close()
    build_s = await asyncio.to_thread(_build, path, n)
    store = await Database.connect(url)
    log = AuditLog(store)
    rng = random.Random(7)
    inc_ms: list[float] = []
    sizes: list[int] = []
    for _ in range(samples):
        sid = rng.randrange(1, n + 1)
        t0 = time.perf_counter()
        p = await log.inclusion("record", sid)
        inc_ms.append((time.perf_counter() - t0) * 1000)
        sizes.append(len(p["hashes"]))
    con_ms: list[float] = []
    con_sizes: list[int] = []
    async with store._read() as conn:
        for _ in range(samples // 3):
            first = rng.randrange(1, n)
            t0 = time.perf_counter()
            hashes = await conn.run_sync(_consistency, first, n)
            con_ms.append((time.perf_counter() - t0) * 1000)
            con_sizes.append(len(hashes))
    await store.close()
    return {
        "leaves": n,
        "build_s": round(build_s, 1),
        "build_leaves_per_s": round(n / build_s),
        "inclusion_ms_p50": round(statistics.median(inc_ms), 3),
        "inclusion_ms_p99": round(_pct(inc_ms, 0.99), 3),
        "inclusion_hashes_max": max(sizes),
        "inclusion_bytes_max": 32 * max(sizes),
        "consistency_ms_p50": round(statistics.median(con_ms), 3),
        "consistency_ms_p99": round(_pct(con_ms, 0.99), 3),
        "consistency_hashes_max": max(con_sizes),
        "log2_n": round(math.log2(n), 2),
        "db_mb": round(path.stat().st_size / 2**20, 1),
    }


async def run_log(out_dir: Path, quick: bool, make: Any, pg_url: Any) -> dict[str, Any]:
    total, rounds, n = (1000, 2, 100_000) if quick else (6000, 3, 1_000_000)
    result: dict[str, Any] = {
        "params": {"records_per_round": total, "rounds": rounds, "writers": 32,
                   "checkpoint_every_s": CHECKPOINT_EVERY_S, "proof_leaves": n},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        result["sqlite"] = await throughput(f"sqlite+aiosqlite:///{tmp}/t.db", make, total, rounds)
        try:
            async with pg_url() as url:
                result["postgresql"] = await throughput(url, make, total, rounds)
        except OSError as exc:
            result["postgresql"] = {"skipped": f"PostgreSQL unreachable: {exc}"}
        result["proofs"] = await proofs(Path(tmp), n)
    return result
