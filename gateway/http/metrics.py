"""Prometheus export of the plain stats the serving layer produces (vLLM's metric names
for speculative decoding, labelled by tenant). Only this module knows Prometheus."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)


class LimiterCollector(Collector):
    """The rate limiter's plain counters (gateway.serving.ratelimit.LimiterStats)."""

    def __init__(self, stats: Any) -> None:
        self.stats = stats

    def collect(self) -> Any:
        names = {
            "backend_errors": "Calls to the shared limiter's Redis that failed",
            "local_fallbacks": "Requests limited by this replica's own window (Redis down)",
            "refused_unavailable": "Requests refused because Redis was down (fail-closed)",
        }
        for name, doc in names.items():
            yield CounterMetricFamily(f"gateway_ratelimit_{name}", doc, getattr(self.stats, name))


class Metrics:
    def __init__(self, queue_depth: Callable[[], float], limiter_stats: Any = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        if limiter_stats is not None:
            r.register(LimiterCollector(limiter_stats))
        self.requests = Counter(
            "gateway_requests",
            "Requests by endpoint, status and mode",
            ["tenant", "endpoint", "status", "mode"],
            registry=r,
        )
        self.latency = Histogram(
            "gateway_request_latency_seconds",
            "End-to-end latency",
            ["endpoint", "mode"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time to first token",
            ["endpoint", "mode"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens", "Prompt tokens", ["tenant"], registry=r
        )
        self.completion_tokens = Counter(
            "gateway_generation_tokens", "Completion tokens", ["tenant", "mode"], registry=r
        )
        self.queue = Gauge("gateway_queue_depth", "Requests waiting or running", registry=r)
        self.queue.set_function(queue_depth)
        self.num_drafts = Counter(
            "spec_decode_num_drafts", "Verify steps with drafted tokens", ["tenant"], registry=r
        )
        self.num_draft_tokens = Counter(
            "spec_decode_num_draft_tokens", "Drafted tokens", ["tenant"], registry=r
        )
        self.num_accepted = Counter(
            "spec_decode_num_accepted_tokens", "Accepted draft tokens", ["tenant"], registry=r
        )
        self.accepted_per_pos = Counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by position in the draft",
            ["tenant", "position"],
            registry=r,
        )

    def observe(self, record: Any, result: Any) -> None:
        """Recorder listener: one audit record (and the engine result, when decoded)."""
        tenant = record.tenant_id or "-"
        mode = record.mode or "none"
        self.requests.labels(tenant, record.endpoint, str(record.status), mode).inc()
        if record.latency_ms is not None:
            self.latency.labels(record.endpoint, mode).observe(record.latency_ms / 1000)
        if record.ttft_ms is not None:
            self.ttft.labels(record.endpoint, mode).observe(record.ttft_ms / 1000)
        self.prompt_tokens.labels(tenant).inc(record.prompt_tokens)
        self.completion_tokens.labels(tenant, mode).inc(record.completion_tokens)
        stats = getattr(result, "stats", None)
        if stats is None or not stats.drafted:
            return
        self.num_drafts.labels(tenant).inc(stats.num_drafts)
        self.num_draft_tokens.labels(tenant).inc(stats.drafted)
        self.num_accepted.labels(tenant).inc(stats.accepted)
        for pos, count in enumerate(stats.accepted_per_pos):
            if count:
                self.accepted_per_pos.labels(tenant, str(pos)).inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
