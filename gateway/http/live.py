"""Live series for the console: per tenant and per draft arm, requests, mode share,
acceptance, tokens/s and p95 latency in fixed time buckets, kept in memory for the last
hour (a recorder listener, like the Prometheus export; lost at restart, which is fine:
Prometheus keeps the history)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BUCKET_S = 5
KEEP = 720
"""Buckets kept per series (an hour of 5-second buckets)."""
MAX_SAMPLES = 256
"""Latencies kept per bucket for its p95 (the first ones; enough for a chart)."""


@dataclass
class _Bucket:
    start: int
    requests: int = 0
    errors: int = 0
    speculative: int = 0
    standard: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    latency_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    def add(self, record: Any) -> None:
        b = self
        b.requests += 1
        b.errors += record.status >= 400
        if record.mode == "speculative":
            b.speculative += 1
        elif record.mode == "standard":
            b.standard += 1
        b.drafted += record.drafted_tokens
        b.accepted += record.accepted_tokens
        if record.status < 400 and record.latency_ms is not None:
            b.tokens += record.completion_tokens
            b.latency_s += record.latency_ms / 1000
            if len(b.latencies_ms) < MAX_SAMPLES:
                b.latencies_ms.append(record.latency_ms)

    def view(self) -> dict[str, Any]:
        decided = self.speculative + self.standard
        ordered = sorted(self.latencies_ms)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else None
        return {
            "t": self.start,
            "requests": self.requests,
            "errors": self.errors,
            "speculative_share": self.speculative / decided if decided else None,
            "acceptance": self.accepted / self.drafted if self.drafted else None,
            "tokens_per_s": self.tokens / self.latency_s if self.latency_s else None,
            "throughput_tokens_per_s": self.tokens / BUCKET_S,
            "p95_ms": p95,
        }


class LiveSeries:
    """Recorder listener keeping bucketed series by ("tenant", id) and ("draft",
    "name@version" | "standard")."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._series: dict[tuple[str, str], deque[_Bucket]] = {}

    def observe(self, observed: Any) -> None:
        record = observed.record
        now = int(self.clock()) // BUCKET_S * BUCKET_S
        keys = [("tenant", record.tenant_id or "-")]
        if record.mode is not None:
            arm = f"{record.draft_model}@{record.draft_version}" if record.draft_model else None
            keys.append(("draft", arm or "standard"))
        for key in keys:
            self._bucket(key, now).add(record)

    def _bucket(self, key: tuple[str, str], start: int) -> _Bucket:
        series = self._series.setdefault(key, deque(maxlen=KEEP))
        if not series or series[-1].start != start:
            series.append(_Bucket(start))
        return series[-1]

    def series(self, kind: str, name: str, window_s: int = 3600) -> list[dict[str, Any]]:
        since = self.clock() - window_s
        return [b.view() for b in self._series.get((kind, name), ()) if b.start >= since]

    def names(self, kind: str) -> list[str]:
        return sorted(n for k, n in self._series if k == kind)
