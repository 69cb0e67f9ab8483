"""The HTTP server span: Litestar's OpenTelemetry plugin (the ASGI middleware), installed
only when tracing is on. It continues an incoming W3C ``traceparent`` and names the span
by route; the serving layer's spans (gateway/serving/tracing.py) are its children."""

from __future__ import annotations

from typing import Any

from litestar.plugins.opentelemetry import OpenTelemetryConfig, OpenTelemetryPlugin
from opentelemetry.sdk.trace import TracerProvider


def http_tracing(provider: TracerProvider | None) -> list[Any]:
    """The plugins to install: none with tracing off (no middleware, no cost)."""
    if provider is None:
        return []
    config = OpenTelemetryConfig(
        tracer_provider=provider,
        # one span per request: no span per ASGI receive/send message (a stream sends
        # hundreds), and no meter (Prometheus has the metrics)
        exclude_spans=["receive", "send"],
        exclude=["^/health$", "^/ready$", "^/metrics$", "^/console/static/"],
    )
    return [OpenTelemetryPlugin(config)]
