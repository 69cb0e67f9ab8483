"""The console's live series: 5-second buckets per tenant and per draft arm, the p95 of each
bucket, the hour kept, refused requests counted but not in the speeds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gateway.database import RequestRecord
from gateway.http.live import BUCKET_S, KEEP, LiveSeries


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def seen(**fields: Any) -> SimpleNamespace:
    base: dict[str, Any] = {"request_id": "r", "endpoint": "completions", "status": 200}
    return SimpleNamespace(record=RequestRecord(**{**base, **fields}), result=None, timings=None)


def spec(latency_ms: float, drafted: int = 10, accepted: int = 6, version: str = "1") -> Any:
    return seen(
        tenant_id="a", mode="speculative", proposer="draft", draft_model="d",
        draft_version=version, drafted_tokens=drafted, accepted_tokens=accepted,
        completion_tokens=20, latency_ms=latency_ms,
    )  # fmt: skip


def test_buckets_per_tenant_and_arm() -> None:
    clock = Clock(1_000_000.0)
    live = LiveSeries(clock)
    for ms in range(1, 101):  # 100 requests, latencies 1..100 ms
        live.observe(spec(float(ms)))
    live.observe(seen(tenant_id="a", mode="standard", completion_tokens=5, latency_ms=50.0))
    live.observe(seen(tenant_id="a", status=429, error_type="rate_limited"))
    clock.t += BUCKET_S
    live.observe(spec(10.0, drafted=4, accepted=0, version="2"))

    rows = live.series("tenant", "a")
    assert [r["t"] for r in rows] == [1_000_000, 1_000_005]
    first = rows[0]
    assert first["requests"] == 102 and first["errors"] == 1
    assert first["speculative_share"] == 100 / 101
    assert first["acceptance"] == 600 / 1000
    assert first["p95_ms"] == 95.0  # index int(0.95 * 101) of 1..50, 50, 51..100 (a 429 has none)
    tokens, seconds = 100 * 20 + 5, (sum(range(1, 101)) + 50) / 1000
    assert abs(first["tokens_per_s"] - tokens / seconds) < 1e-9
    assert live.names("draft") == ["d@1", "d@2", "standard"]
    assert [r["acceptance"] for r in live.series("draft", "d@2")] == [0.0]
    assert live.series("draft", "d@1")[0]["requests"] == 100
    assert live.series("tenant", "nobody") == []


def test_window_and_hour_kept() -> None:
    clock = Clock(0.0)
    live = LiveSeries(clock)
    for _ in range(KEEP + 10):
        live.observe(spec(5.0))
        clock.t += BUCKET_S
    assert len(live.series("tenant", "a", window_s=10**9)) == KEEP
    assert len(live.series("tenant", "a", window_s=3 * BUCKET_S)) == 3
