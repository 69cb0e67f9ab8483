"""Per-request traces (OpenTelemetry), off unless the standard OTEL_* variables turn them on.

One trace per request: the HTTP server span (Litestar's OpenTelemetry plugin, parented on
an incoming W3C ``traceparent``) holds ``gateway.auth``, ``gateway.policy.decide``, per
choice ``gateway.queue`` / ``gateway.prefill`` / ``gateway.decode``, and
``gateway.audit.write``; SQLAlchemy adds a span per statement. The engine knows nothing of
this: the worker stamps each job's times (``Job.submitted_ns``...) and the engine returns
its counters as plain data (``DecodeStats``); the queue, prefill and decode spans are made
from those after the run, with their real start and end times. Spans carry ids, counts and
timings, never prompt or completion text.

Configuration (read once at start, see docs/operations.md "Traces, metrics, dashboards"):

- ``OTEL_SDK_DISABLED=true``: off, whatever else is set.
- ``OTEL_TRACES_EXPORTER``: comma-separated ``otlp`` (OTLP over HTTP/protobuf; endpoint,
  headers and timeouts from ``OTEL_EXPORTER_OTLP_*``), ``console``, ``memory`` (kept in
  the process: benchmarks), ``none``. Unset means ``none``: unlike the SDK's default, the
  gateway exports nothing unless asked, and with tracing off no middleware, span or
  database hook is installed at all.
- ``OTEL_SERVICE_NAME`` (default ``spec-gateway``), ``OTEL_RESOURCE_ATTRIBUTES``,
  ``OTEL_TRACES_SAMPLER`` / ``_ARG``, ``OTEL_BSP_*``: as the SDK reads them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

if TYPE_CHECKING:
    from gateway.serving.worker import Job

EXPORTERS = ("otlp", "console", "memory", "none")
DEFAULT_SERVICE_NAME = "spec-gateway"


class TracingConfigError(ValueError):
    """An OTEL_* value the gateway cannot honour (named in the message)."""


def provider_from_env(env: Mapping[str, str]) -> TracerProvider | None:
    """The tracer provider the OTEL_* variables ask for, or None (tracing off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "none").split(",")]
    names = [n for n in names if n and n != "none"]
    if not names:
        return None
    for name in names:
        if name not in EXPORTERS:
            raise TracingConfigError(
                f"OTEL_TRACES_EXPORTER: unknown exporter '{name}' (one of {', '.join(EXPORTERS)})"
            )
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if "otlp" in names and protocol != "http/protobuf":
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is supported, got '{protocol}'"
        )
    service = env.get("OTEL_SERVICE_NAME")
    if not service and "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        service = DEFAULT_SERVICE_NAME
    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES itself; the name comes from `env`
    resource = Resource.create({"service.name": service} if service else {})
    provider = TracerProvider(resource=resource)
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            memory = InMemorySpanExporter()
            provider.add_span_processor(SimpleSpanProcessor(memory))
            provider.memory_exporter = memory  # type: ignore[attr-defined]
    return provider


@dataclass(frozen=True)
class RunTimings:
    """Where a request's time went, from the worker's stamps (seconds; None where a phase
    never happened). With n choices: the slowest choice's."""

    queue_s: float | None = None
    """Queued on the worker until its row was admitted to a batch."""
    first_token_s: float | None = None
    """Admitted until its first output (the prefill and the first step)."""
    decode_s: float | None = None
    """First output until the row finished."""

    @classmethod
    def of_jobs(cls, jobs: list[Job]) -> RunTimings:
        def longest(start: str, end: str) -> float | None:
            spans = [
                (getattr(j, end) - getattr(j, start)) / 1e9
                for j in jobs
                if getattr(j, start) is not None and getattr(j, end) is not None
            ]
            return max(spans) if spans else None

        return cls(
            queue_s=longest("submitted_ns", "admitted_ns"),
            first_token_s=longest("admitted_ns", "first_event_ns"),
            decode_s=longest("first_event_ns", "finished_ns"),
        )


_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


class Tracing:
    """The serving layer's spans. With no provider every method is a no-op that costs one
    attribute test."""

    def __init__(self, provider: TracerProvider | None) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("gateway") if provider is not None else None

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def span(
        self, name: str, attributes: Mapping[str, Any] | None = None
    ) -> contextlib.AbstractContextManager[trace.Span | None]:
        """A child of the current span (a no-op context giving None when off)."""
        if self._tracer is None:
            return _OFF
        return self._tracer.start_as_current_span(name, attributes=_clean(attributes or {}))

    def trace_id(self) -> str | None:
        """The current trace's id (32 hex digits), None when off or outside a span."""
        if self._tracer is None:
            return None
        ctx = trace.get_current_span().get_span_context()
        return format(ctx.trace_id, "032x") if ctx.is_valid else None

    def run(self, jobs: list[Job], stats: list[Any]) -> None:
        """The queue, prefill and decode spans of each choice's row, from the worker's
        stamps (children of the current span), with the engine's counters."""
        if self._tracer is None:
            return
        for index, (job, st) in enumerate(zip(jobs, stats, strict=False)):
            base = {"gateway.choice": index}
            self._phase("gateway.queue", job.submitted_ns, job.admitted_ns, base)
            prefill = {**base, "gateway.prefill_s": getattr(st, "prefill_s", None)}
            self._phase("gateway.prefill", job.admitted_ns, job.first_event_ns, prefill)
            self._phase(
                "gateway.decode", job.first_event_ns, job.finished_ns, {**base, **_decode(st)}
            )

    def _phase(
        self, name: str, start: int | None, end: int | None, attributes: Mapping[str, Any]
    ) -> None:
        assert self._tracer is not None
        if start is None or end is None:
            return
        span = self._tracer.start_span(name, start_time=start, attributes=_clean(attributes))
        span.end(end_time=max(start, end))

    def instrument_database(self, engine: Any) -> None:
        """SQLAlchemy spans for one engine (an AsyncEngine's sync_engine): statements with
        their placeholders, never the bound values."""
        if self.provider is None:
            return
        from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
        from opentelemetry.metrics import NoOpMeterProvider

        tracer = self.provider.get_tracer("opentelemetry.instrumentation.sqlalchemy")
        usage = NoOpMeterProvider().get_meter("gateway").create_up_down_counter("unused")
        EngineTracer(tracer, engine, usage)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


# The cost model's inputs and result, as the policy engine recorded them (Decision.inputs):
# why auto chose what it chose (acceptance and c, and where each came from; the verify cost
# at the chosen k on the batch it assumed; the expected speedup against its threshold).
COST_INPUTS = (
    "acceptance", "c", "c_source", "history_source", "samples", "k_best",
    "expected_speedup", "verify_cost_at_k", "threshold",
)  # fmt: skip


def decision_attributes(d: Any, load: Any, target: Any, drafts: Iterable[Any]) -> dict[str, Any]:
    """The decision span's attributes (a policy Decision, the Load it assumed, the target's
    manifest entry and its drafts'): what decided, never the request's text."""
    draft = None
    if d.draft_version is not None:
        names = [e.name for e in drafts if e.version == d.draft_version]
        draft = f"{names[0]}@{d.draft_version}" if names else d.draft_version
    return _clean(
        {
            "gateway.decision.id": d.decision_id,
            "gateway.policy.revision": d.policy_revision,
            "gateway.decision.mode": d.mode,
            "gateway.decision.requested_mode": d.requested_mode,
            "gateway.decision.auto_outcome": d.auto_outcome,
            "gateway.decision.proposer": d.proposer,
            "gateway.decision.draft": draft,
            "gateway.decision.k_min": d.k_min,
            "gateway.decision.k_max": d.k_max,
            "gateway.decision.k": d.k,
            "gateway.decision.rule_ids": tuple(d.rule_ids),
            "gateway.decision.reason_codes": tuple(d.reason_codes),
            "gateway.decision.batch_rows": load.batch_rows,
            "gateway.decision.queue_depth": load.queue_depth,
            "gateway.target": f"{target.name}@{target.version}",
            **{
                f"gateway.decision.input.{name}": d.inputs[name]
                for name in COST_INPUTS
                if isinstance(d.inputs.get(name), int | float | str)
            },
        }
    )


def _decode(stats: Any) -> dict[str, Any]:
    if stats is None:
        return {}
    return {
        "gateway.decode.steps": stats.target_forwards,
        "gateway.decode.tokens": stats.generated_tokens,
        "gateway.decode.drafted": stats.drafted,
        "gateway.decode.accepted": stats.accepted,
        "gateway.decode.acceptance_rate": stats.acceptance_rate,
        "gateway.decode.mean_accepted_length": stats.mean_accepted_length,
        "gateway.decode.k": stats.final_k,
        "gateway.decode.k_max_used": max(stats.k_history) if stats.k_history else None,
        "gateway.decode.paused_steps": stats.paused_steps,
        "gateway.decode.mean_batch_rows": stats.mean_batch_rows,
        "gateway.decode.draft_s": stats.draft_s,
        "gateway.decode.verify_s": stats.verify_s,
    }


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int, float and sequences of them; None is dropped."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        out[key] = list(value) if isinstance(value, tuple | list) else value
    return out
