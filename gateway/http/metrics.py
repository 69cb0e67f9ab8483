"""Prometheus export of the plain stats the serving layer produces. Only this module knows
Prometheus.

The speculative-decoding counters keep vLLM's names (``spec_decode_num_drafts``,
``_num_draft_tokens``, ``_num_accepted_tokens``, ``_num_accepted_tokens_per_pos``); every
per-request series is labelled by tenant, mode, proposer and draft (``name@version``, or
``none``), so acceptance, cost and latency can be read per rollout arm. Derived in PromQL
(deploy/grafana/gateway.json does it):

- acceptance rate = num_accepted_tokens / num_draft_tokens;
- mean accepted length = 1 + num_accepted_tokens / num_drafts (tokens per verify step);
- drafted but rejected = gateway_spec_decode_rejected_tokens (compute speculation wasted);
- cost per generated token = (gateway_target_forward_seconds + gateway_draft_forward_seconds)
  / gateway_generation_tokens (the forwards a request waited on, per token it got);
- verify overhead = a speculative verify step's mean time (target_forward_seconds /
  target_forwards) over a standard step's.

Calls to the inference endpoints that fail authentication (no key, a wrong, revoked or
expired key or token: 401) are not in the audit chain (anyone could grow it); they are
counted here, in ``gateway_unauthenticated_requests_total`` by endpoint, as well as in
``gateway_requests`` (tenant ``-``, status 401).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
ARM = ["tenant", "mode", "proposer", "draft"]
"""The labels of every per-request series."""


def arm_labels(record: Any) -> tuple[str, str, str, str]:
    """(tenant, mode, proposer, draft) of an audit record, '-' / 'none' where absent."""
    draft = f"{record.draft_model}@{record.draft_version}" if record.draft_model else "none"
    return (record.tenant_id or "-", record.mode or "none", record.proposer or "none", draft)


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


class WorkerCollector(Collector):
    """The inference worker's preemptions (serving/fairness.py): rows parked for another
    tenant's job so far, and parked jobs waiting to resume now."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def collect(self) -> Any:
        yield CounterMetricFamily(
            "gateway_preemptions", "Rows parked to give another tenant its share of a batch",
            self.worker.preemptions,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "gateway_parked_requests", "Requests whose row is parked, waiting to resume",
            self.worker.fair.parked,
        )  # fmt: skip


class Metrics:
    def __init__(
        self, queue_depth: Callable[[], float], limiter_stats: Any = None, worker: Any = None
    ) -> None:
        self.registry = r = CollectorRegistry()
        if limiter_stats is not None:
            r.register(LimiterCollector(limiter_stats))
        if worker is not None:
            r.register(WorkerCollector(worker))

        def counter(name: str, doc: str, labels: list[str] = ARM) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["endpoint", *ARM], buckets=buckets, registry=r)

        self.requests = counter(
            "gateway_requests", "Requests by endpoint, status and mode",
            ["tenant", "endpoint", "status", "mode"],
        )  # fmt: skip
        self.latency = histogram(
            "gateway_request_latency_seconds", "End-to-end latency", LATENCY_BUCKETS
        )
        self.ttft = histogram(
            "gateway_time_to_first_token_seconds", "Time to first token", LATENCY_BUCKETS
        )
        self.itl = histogram(
            "gateway_time_per_output_token_seconds",
            "Inter-token latency: a request's decode time / (its tokens - 1)",
            TOKEN_BUCKETS,
        )
        self.queue_wait = histogram(
            "gateway_queue_wait_seconds",
            "Time queued on the inference worker before the row joined a batch",
            LATENCY_BUCKETS,
        )
        self.unauthenticated = counter(
            "gateway_unauthenticated_requests",
            "Inference calls refused for want of a valid key or token (401; not audited)",
            ["endpoint"],
        )
        self.prompt_tokens = counter("gateway_prompt_tokens", "Prompt tokens", ["tenant"])
        self.cached_prompt_tokens = counter(
            "gateway_prompt_cached_tokens",
            "Prompt tokens reused from a kept prefix instead of prefilled",
            ["tenant"],
        )
        self.completion_tokens = counter("gateway_generation_tokens", "Completion tokens")
        self.queue = Gauge("gateway_queue_depth", "Requests waiting or running", registry=r)
        self.queue.set_function(queue_depth)
        self.num_drafts = counter("spec_decode_num_drafts", "Verify steps with drafted tokens")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Drafted tokens")
        self.num_accepted = counter("spec_decode_num_accepted_tokens", "Accepted draft tokens")
        self.accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by position in the draft",
            [*ARM, "position"],
        )
        self.rejected = counter(
            "gateway_spec_decode_rejected_tokens", "Drafted tokens the verifier rejected"
        )
        self.target_s = counter(
            "gateway_target_forward_seconds",
            "Target forward time the requests waited on (prefill and every step)",
        )
        self.target_forwards = counter(
            "gateway_target_forwards", "Target forwards after the prefill (decode steps)"
        )
        self.step_s = counter(
            "gateway_target_step_seconds", "Target forward time of the decode steps alone"
        )
        self.draft_s = counter(
            "gateway_draft_forward_seconds", "Proposing time (draft forwards or lookups)"
        )

    def observe(self, observed: Any) -> None:
        """Recorder listener: one audit record, with the engine result and the worker's
        timings when the request decoded."""
        record, result, timings = observed.record, observed.result, observed.timings
        arm = arm_labels(record)
        tenant, mode = arm[0], arm[1]
        self.requests.labels(tenant, record.endpoint, str(record.status), mode).inc()
        if record.error_type == "authentication":  # only authentication refuses with 401
            self.unauthenticated.labels(record.endpoint).inc()
        per_request = (record.endpoint, *arm)
        if record.latency_ms is not None:
            self.latency.labels(*per_request).observe(record.latency_ms / 1000)
        if record.ttft_ms is not None:
            self.ttft.labels(*per_request).observe(record.ttft_ms / 1000)
        self.prompt_tokens.labels(tenant).inc(record.prompt_tokens)
        self.completion_tokens.labels(*arm).inc(record.completion_tokens)
        if timings is not None:
            if timings.queue_s is not None:
                self.queue_wait.labels(*per_request).observe(timings.queue_s)
            if timings.decode_s is not None and record.completion_tokens > 1:
                itl = timings.decode_s / (record.completion_tokens - 1)
                self.itl.labels(*per_request).observe(itl)
        stats = getattr(result, "stats", None)
        if stats is None:
            return
        self.cached_prompt_tokens.labels(tenant).inc(stats.cached_prompt_tokens)
        self.target_s.labels(*arm).inc(stats.verify_s + stats.prefill_s)
        self.step_s.labels(*arm).inc(stats.verify_s)
        decode_forwards = stats.target_forwards - (1 if stats.prefill_s > 0 else 0)
        self.target_forwards.labels(*arm).inc(max(0, decode_forwards))
        self.draft_s.labels(*arm).inc(stats.draft_s)
        if not stats.drafted:
            return
        self.num_drafts.labels(*arm).inc(stats.num_drafts)
        self.num_draft_tokens.labels(*arm).inc(stats.drafted)
        self.num_accepted.labels(*arm).inc(stats.accepted)
        self.rejected.labels(*arm).inc(stats.drafted - stats.accepted)
        for pos, count in enumerate(stats.accepted_per_pos):
            if count:
                self.accepted_per_pos.labels(*arm, str(pos)).inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
