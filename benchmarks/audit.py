"""Audit write throughput and latency through AuditWriter, on SQLite and PostgreSQL.

``run(out_dir, quick)`` returns a dict (the benchmark runner writes the JSON):

    {"sqlite": {"writers_1": {...}, "writers_32": {...}}, "postgresql": {...}, "params": {...}}

Each scenario: ``writes_per_s``, ``transactions``, ``mean_batch``, and per-write latency
(``mean_ms``, ``p50_ms``, ``p99_ms``: time from ``write()`` to durable return). With one writer
the mean latency is the added latency of auditing one request (one fsync'ed commit; the writer
never lingers when alone). PostgreSQL uses a fresh database on env ``TEST_POSTGRES_URL``
(default ``postgresql+asyncpg://postgres@127.0.0.1:5432/test``); it is reported as skipped
when unreachable.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.database import AuditWriter, Database, RequestRecord

DEFAULT_PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


def _record(i: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"bench-{i}", decision_id=f"d-{i}", tenant_id=f"t{i % 4}", key_id="key_b",
        endpoint="/v1/chat/completions", status=200, requested_mode="auto", mode="speculative",
        reason_codes=["alpha_above_c"], policy_revision="r" * 64, target_model="tgt",
        target_version="1", target_sha256="a" * 64, proposer="draft", draft_model="drf",
        draft_version="1", draft_sha256="b" * 64, k_min=2, k_max=6, drafted_tokens=40,
        accepted_tokens=29, temperature=0.7, top_p=0.95, prompt_tokens=120,
        completion_tokens=64, latency_ms=81.5, ttft_ms=9.25, prompt_sha256="c" * 64,
        completion_sha256="d" * 64,
    )  # fmt: skip


async def _scenario(url: str, writers: int, total: int) -> dict[str, Any]:
    store = await Database.connect(url)
    writer = AuditWriter(store, max_batch=64, max_delay_ms=5)
    await writer.start()
    latencies: list[float] = []

    async def lane(lane_no: int) -> None:
        for i in range(lane_no, total, writers):
            start = time.perf_counter()
            await writer.write(_record(i))
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(lane(n) for n in range(writers)))
    elapsed = time.perf_counter() - start
    await writer.stop()
    await store.close()
    latencies.sort()
    stats = writer.stats
    return {
        "writes": total,
        "writes_per_s": round(total / elapsed, 1),
        "transactions": stats.transactions,
        "mean_batch": round(stats.records / max(stats.transactions, 1), 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 3),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
    }


async def _backend(url: str, sizes: dict[int, int]) -> dict[str, Any]:
    await (await Database.connect(url, upgrade=True)).close()
    out: dict[str, Any] = {}
    for writers, total in sizes.items():
        out[f"writers_{writers}"] = await _scenario(url, writers, total)
    verify = await (store := await Database.connect(url)).verify()
    await store.close()
    out["chain_ok"] = verify["ok"] and verify["checked"] == sum(sizes.values())
    return out


@asynccontextmanager
async def _pg_database() -> AsyncIterator[str]:
    admin_url = os.environ.get("TEST_POSTGRES_URL", DEFAULT_PG)
    name = f"bench_{secrets.token_hex(4)}"
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            async with admin.connect() as conn:
                await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


async def _run(out_dir: Path, quick: bool) -> dict[str, Any]:
    sizes = {1: 100, 32: 800} if quick else {1: 500, 32: 5000}
    result: dict[str, Any] = {"params": {"quick": quick, "sizes": sizes, "max_batch": 64}}
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        result["sqlite"] = await _backend(f"sqlite+aiosqlite:///{tmp}/bench.db", sizes)
    try:
        async with _pg_database() as url:
            result["postgresql"] = await _backend(url, sizes)
    except OSError as exc:
        result["postgresql"] = {"skipped": f"PostgreSQL unreachable: {exc}"}
    return result


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_run(out_dir, quick))


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(Path("benchmarks/reports"), quick="--quick" in sys.argv), indent=2))
