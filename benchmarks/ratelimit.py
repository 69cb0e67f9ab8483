"""What the shared rate limit adds to a request: the Redis limiter's admit (one Lua script,
one round trip) and settle, against the in-process window, on this machine's Redis.

Sequential calls measure the latency one request sees; a second pass runs 16 admits at a
time (a busy replica). Goal: p50 of admit + settle with Redis under 1 ms on loopback.
Redis from env GATEWAY_REDIS_URL, default redis://127.0.0.1:6379/0; keys under a fresh
prefix, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.serving.ratelimit import Limiter, Limits, RateLimiter
from gateway.serving.ratelimit_redis import RedisRateLimiter

LIMITS = Limits(requests_per_minute=10**9, tokens_per_minute=10**12)
GOAL_P50_MS = 1.0


def _summary(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    q = statistics.quantiles(ms, n=100)
    return {"p50_ms": q[49], "p95_ms": q[94], "p99_ms": q[98], "n": len(ms)}


async def _timed(n: int, call: Callable[[int], Awaitable[Any]]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - t0)
    return out


async def _measure(limiter: Limiter, n: int) -> dict[str, Any]:
    tenants = [f"tenant-{i}" for i in range(8)]
    tickets: list[Any] = []

    async def admit(i: int) -> None:
        quota, ticket = await limiter.admit(tenants[i % len(tenants)], LIMITS, 300)
        assert quota.allowed
        tickets.append(ticket)

    async def settle(i: int) -> None:
        await limiter.settle(tickets[i], 120)

    await _timed(50, admit)  # warm-up: connection, script cache
    tickets.clear()
    admits = await _timed(n, admit)
    settles = await _timed(n, settle)
    both = [a + s for a, s in zip(admits, settles, strict=True)]

    async def burst() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(limiter.admit(tenants[0], LIMITS, 1) for _ in range(16)))
        return time.perf_counter() - t0

    bursts = [await burst() for _ in range(max(1, n // 16))]
    return {
        "admit": _summary(admits),
        "settle": _summary(settles),
        "admit_plus_settle": _summary(both),
        "burst16_wall": _summary(bursts),
    }


async def _run(n: int) -> dict[str, Any]:
    url = os.environ.get("GATEWAY_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"bench:{secrets.token_hex(4)}:"
    shared = RedisRateLimiter(url, prefix=prefix)
    if not await shared.ping():
        await shared.close()
        raise RuntimeError(f"Redis unreachable at {url}")
    try:
        redis_result = await _measure(shared, n)
        assert shared.stats.backend_errors == 0
        keys = [k async for k in shared.client.scan_iter(match=prefix + "*")]
        if keys:
            await shared.client.delete(*keys)
    finally:
        await shared.close()
    local_result = await _measure(RateLimiter(), n)
    p50 = redis_result["admit_plus_settle"]["p50_ms"]
    return {
        "goal_p50_ms": GOAL_P50_MS,
        "redis_admit_plus_settle_p50_ms": p50,
        "meets_goal": p50 < GOAL_P50_MS,
        "redis": redis_result,
        "in_process": local_result,
        "calls": n,
    }


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    return asyncio.run(_run(500 if quick else 3000))


def table(result: dict[str, Any]) -> str:
    rows = [f"{'limiter':<12} {'step':<18} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"]
    for name in ("redis", "in_process"):
        for step in ("admit", "settle", "admit_plus_settle", "burst16_wall"):
            s = result[name][step]
            rows.append(
                f"{name:<12} {step:<18} {s['p50_ms']:8.3f} {s['p95_ms']:8.3f} {s['p99_ms']:8.3f}"
            )
    verdict = "meets" if result["meets_goal"] else "misses"
    rows.append(
        f"Redis admit + settle p50 {result['redis_admit_plus_settle_p50_ms']:.3f} ms "
        f"({verdict} the {result['goal_p50_ms']} ms goal)"
    )
    return "\n".join(rows)
