"""Audit write throughput and latency through AuditWriter, on SQLite and PostgreSQL.

``run(out_dir, quick)`` returns a dict (the benchmark runner writes the JSON):

    {"sqlite": {"writers_1": {...}, "writers_32": {...}}, "postgresql": {...}, "params": {...}}

Each scenario: ``requests_per_s``, ``writes_per_s``, ``transactions``, ``mean_batch``, and
per-request latency (``mean_ms``, ``p50_ms``, ``p99_ms``: time from ``write()`` to durable
return). ``writers_N``: one final record per request (the audit path before revision
0005_admission_records); ``admitted_N``: the admission, then the final record naming it
(the path since: two durable writes a request, the first before its first byte). With one writer
the mean latency is the added latency of auditing one request (one fsync'ed commit; the writer
never lingers when alone). PostgreSQL uses a fresh database on env ``TEST_POSTGRES_URL``
(default ``postgresql+asyncpg://postgres@127.0.0.1:5432/test``); it is reported as skipped
when unreachable.

``ttft`` serves streamed chat
completions from a real gateway process (uvicorn, the demo models, greedy, 8 new tokens) on
a SQLite file and on PostgreSQL, and reports, as a client sees them, the time to the first
byte (the role chunk, sent once ``start`` returned: after the admission record is durable),
to the first token (the first chunk with text) and to the end, for one client at a
time and for 8 concurrent clients, plus completed requests/s. This is where the audit's
place on the request path shows: a record written before the first byte is in the TTFT.
Env ``AUDIT_BENCH_CHECKOUT`` runs that gateway from another checkout (a baseline).

``log``: the verifiable log's cost (benchmarks/_audit_log.py): records/s with the checkpoint
job off and on, and inclusion / consistency proof time and size at 1M leaves. ``python -m
benchmarks.audit --log`` runs only that part (report: benchmarks/reports/audit_log.json).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from benchmarks import _audit_log
from benchmarks._server import gateway
from gateway.database import Admission, AuditWriter, Database, RequestRecord

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


def _admission(i: int) -> Admission:
    return Admission(
        request_id=f"bench-{i}", decision_id=f"d-{i}", tenant_id=f"t{i % 4}", key_id="key_b",
        endpoint="/v1/chat/completions", mode="speculative", reason_codes=["alpha_above_c"],
        policy_revision="r" * 64, target_model="tgt", target_version="1",
        target_sha256="a" * 64, proposer="draft", draft_model="drf", draft_version="1",
        draft_sha256="b" * 64, prompt_tokens=120, prompt_sha256="c" * 64,
    )  # fmt: skip


async def _scenario(url: str, writers: int, total: int, admitted: bool = False) -> dict[str, Any]:
    """``total`` requests' audit writes from ``writers`` concurrent lanes: each its final
    record, or (``admitted``) its admission and then the final record naming it (the
    request path since revision 0005_admission_records); latency per request."""
    store = await Database.connect(url)
    writer = AuditWriter(store, max_batch=64, max_delay_ms=5)
    await writer.start()
    latencies: list[float] = []

    async def lane(lane_no: int) -> None:
        for i in range(lane_no, total, writers):
            start = time.perf_counter()
            record = _record(i)
            if admitted:
                admission_id = await writer.write(_admission(i))
                record = dataclasses.replace(record, admission_id=admission_id)
            await writer.write(record)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(lane(n) for n in range(writers)))
    elapsed = time.perf_counter() - start
    await writer.stop()
    await store.close()
    latencies.sort()
    stats = writer.stats
    return {
        "writes": total * (2 if admitted else 1),
        "requests_per_s": round(total / elapsed, 1),
        "writes_per_s": round(total * (2 if admitted else 1) / elapsed, 1),
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
    for writers, total in sizes.items():
        out[f"admitted_{writers}"] = await _scenario(url, writers, total, admitted=True)
    verify = await (store := await Database.connect(url)).verify()
    await store.close()
    out["chain_ok"] = (
        verify["ok"]
        and verify["checked"] == 2 * sum(sizes.values())
        and verify["admissions"]["checked"] == sum(sizes.values())
        and verify["incomplete"]["count"] == 0
    )
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


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)


def _has_content(event: bytes) -> bool:
    """Whether one SSE event is a chunk with text in its delta."""
    if not event.startswith(b"data: {"):
        return False
    choices = json.loads(event[6:]).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


async def _one_stream(client: httpx.AsyncClient, key: str, i: int) -> tuple[float, float, float]:
    """(time to the first byte, to the first text delta, to the end) of one streamed chat
    completion."""
    body = {
        "model": "demo-code-target", "stream": True, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": f"def f{i}(x):"}],
    }  # fmt: skip
    start = time.perf_counter()
    first_byte: float | None = None
    first_token: float | None = None
    buffer = b""
    headers = {"authorization": f"Bearer {key}"}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for chunk in r.aiter_raw():
            now = time.perf_counter() - start
            if first_byte is None and chunk:
                first_byte = now
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            if first_token is None and any(_has_content(e) for e in events):
                first_token = now
    assert first_byte is not None
    return (
        first_byte,
        first_token if first_token is not None else first_byte,
        (time.perf_counter() - start),
    )


async def _ttft_lanes(url: str, key: str, lanes: int, total: int) -> dict[str, Any]:
    bytes_: list[float] = []
    tokens: list[float] = []
    wholes: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for i in range(3):  # warm-up
            await _one_stream(client, key, 10_000 + i)

        async def lane(n: int) -> None:
            for i in range(n, total, lanes):
                first_byte, first_token, whole = await _one_stream(client, key, i)
                bytes_.append(first_byte)
                tokens.append(first_token)
                wholes.append(whole)

        start = time.perf_counter()
        await asyncio.gather(*(lane(n) for n in range(lanes)))
        elapsed = time.perf_counter() - start
    return {
        "requests": total,
        "requests_per_s": round(total / elapsed, 2),
        "first_byte_p50_ms": _pct(bytes_, 0.5),
        "first_byte_p90_ms": _pct(bytes_, 0.9),
        "ttft_p50_ms": _pct(tokens, 0.5),
        "ttft_p90_ms": _pct(tokens, 0.9),
        "ttft_mean_ms": round(statistics.fmean(tokens) * 1000, 2),
        "latency_p50_ms": _pct(wholes, 0.5),
    }


def _ttft_backend(database_url: str | None, sizes: dict[int, int]) -> dict[str, Any]:
    env = {"GATEWAY_DATABASE_URL": database_url} if database_url else {}
    checkout = os.environ.get("AUDIT_BENCH_CHECKOUT")  # e.g. a `git archive` of the baseline
    with gateway(cwd=Path(checkout) if checkout else None, **env) as running:
        key = running.tenant("bench-ttft")
        return {
            f"clients_{lanes}": asyncio.run(_ttft_lanes(running.url, key, lanes, total))
            for lanes, total in sizes.items()
        }


async def _ttft(quick: bool) -> dict[str, Any]:
    sizes = {1: 20, 8: 40} if quick else {1: 60, 8: 160}
    out: dict[str, Any] = {"params": {"sizes": sizes, "max_tokens": 8}}
    out["sqlite"] = await asyncio.to_thread(_ttft_backend, None, sizes)
    try:
        async with _pg_database() as url:
            out["postgresql"] = await asyncio.to_thread(_ttft_backend, url, sizes)
    except OSError as exc:
        out["postgresql"] = {"skipped": f"PostgreSQL unreachable: {exc}"}
    return out


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
    result["ttft"] = await _ttft(quick)
    result["log"] = await _audit_log.run_log(out_dir, quick, _record, _pg_database)
    return result


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_run(out_dir, quick))


def run_log_only(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    """Only the verifiable log's costs, written to ``out_dir/audit_log.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(_audit_log.run_log(out_dir, quick, _record, _pg_database))
    (out_dir / "audit_log.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    import sys

    quick = "--quick" in sys.argv
    runner = run_log_only if "--log" in sys.argv else run
    print(json.dumps(runner(Path("benchmarks/reports"), quick=quick), indent=2))
