"""The Redis rate limiter on the machine's Redis: one window shared by several limiters
(replicas), tokens settled to what was used, the window sliding, and Redis down (falls back
to per-replica limits and counts it, or refuses with 503 when fail-closed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.serving.errors import GatewayError
from gateway.serving.ratelimit import Limits
from gateway.serving.ratelimit_redis import RedisRateLimiter
from tests.integration.service.harness import sqlite_gateway
from tests.integration.service.process import free_port
from tests.redis_util import redis_prefix_fixture, redis_url

redis_prefix = redis_prefix_fixture()


async def test_replicas_share_one_window_under_a_burst(redis_prefix: str) -> None:
    replicas = [RedisRateLimiter(redis_url(), prefix=redis_prefix) for _ in range(3)]
    limits = Limits(requests_per_minute=10, tokens_per_minute=10**6)
    try:
        results = await asyncio.gather(
            *(replicas[i % 3].admit("acme", limits, 5) for i in range(60))
        )
        admitted = [q for q, t in results if q.allowed]
        assert len(admitted) == 10
        assert all(t is None for q, t in results if not q.allowed)
        refused = [q for q, _ in results if not q.allowed]
        assert all(q.remaining_requests == 0 and 0 < q.retry_after_s <= 60 for q in refused)
        # another tenant has its own window
        quota, _ = await replicas[0].admit("other", limits, 5)
        assert quota.allowed and quota.remaining_requests == 9
        assert all(r.stats.backend_errors == 0 for r in replicas)
    finally:
        for r in replicas:
            await r.close()


async def test_tokens_settle_to_what_was_used_and_the_window_slides(redis_prefix: str) -> None:
    a = RedisRateLimiter(redis_url(), prefix=redis_prefix, window_s=1.0)
    b = RedisRateLimiter(redis_url(), prefix=redis_prefix, window_s=1.0)
    limits = Limits(requests_per_minute=100, tokens_per_minute=150)
    try:
        first, ticket = await a.admit("acme", limits, 100)
        assert first.allowed and first.remaining_tokens == 50
        second, _ = await b.admit("acme", limits, 100)
        assert not second.allowed and second.remaining_tokens == 50
        await a.settle(ticket, 20)  # the request used 20 of its 100
        third, _ = await b.admit("acme", limits, 100)
        assert third.allowed and third.remaining_tokens == 30
        await asyncio.sleep(1.1)  # both tickets leave the window
        fourth, _ = await a.admit("acme", limits, 150)
        assert fourth.allowed and fourth.remaining_tokens == 0
    finally:
        await a.close()
        await b.close()


async def test_redis_down_falls_back_to_local_limits_or_refuses() -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    limits = Limits(requests_per_minute=2, tokens_per_minute=10**6)
    open_ = RedisRateLimiter(closed)
    try:
        results = [await open_.admit("acme", limits, 1) for _ in range(3)]
        assert [q.allowed for q, _ in results] == [True, True, False]  # this replica's window
        await open_.settle(results[0][1], 0)
        assert open_.stats.backend_errors >= 1 and open_.stats.local_fallbacks == 3
    finally:
        await open_.close()
    shut = RedisRateLimiter(closed, fail_closed=True)
    try:
        with pytest.raises(GatewayError) as err:
            await shut.admit("acme", limits, 1)
        assert err.value.kind == "unavailable" and err.value.code == "rate_limiter_unavailable"
        assert shut.stats.refused_unavailable == 1 and shut.stats.backend_errors == 1
    finally:
        await shut.close()


@pytest.mark.parametrize("fail_closed", [False, True])
async def test_a_gateway_with_redis_down_serves_on_local_limits_or_refuses(
    tiny_manifest: Path, tmp_path: Path, fail_closed: bool
) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    async with sqlite_gateway(
        tiny_manifest, tmp_path, redis_url=closed, redis_fail_closed=fail_closed
    ) as g:
        r = await g.complete(max_tokens=2)
        metrics = (await g.client.get("/metrics")).text
        if fail_closed:
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "rate_limiter_unavailable"
            assert "gateway_ratelimit_refused_unavailable_total 1.0" in metrics
        else:
            assert r.status_code == 200, r.text
            assert r.headers["x-ratelimit-limit-requests"] == "600"
            assert "gateway_ratelimit_local_fallbacks_total 1.0" in metrics
        assert "gateway_ratelimit_backend_errors_total 1.0" in metrics
        records = await g.records()
        assert records[0]["status"] == r.status_code  # refused or served, it is audited
