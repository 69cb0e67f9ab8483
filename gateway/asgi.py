"""Composition root: create_app(settings) builds the Litestar app. The only module that
sees every layer; keep it short."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.openapi import OpenAPIConfig
from opentelemetry.sdk.trace import TracerProvider

from gateway.http import admin, audit, audit_log, console, contract, openai, ops, strict
from gateway.http.errors import EXCEPTION_HANDLERS
from gateway.http.live import LiveSeries
from gateway.http.logging import configure, log_request
from gateway.http.metrics import Metrics
from gateway.http.tracing import http_tracing
from gateway.serving import build_services
from gateway.serving.tracing import Tracing, provider_from_env
from gateway.settings import Settings


def create_app(
    settings: Settings | None = None, tracer_provider: TracerProvider | None = None
) -> Litestar:
    """``tracer_provider``: where spans go (tests pass an in-memory one); default what the
    OTEL_* variables say, which by default is nowhere (tracing off)."""
    settings = settings or Settings.from_env()
    configure(settings.log_level)
    owned = tracer_provider is None
    provider = provider_from_env(os.environ) if owned else tracer_provider
    tracing = Tracing(provider)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        services = await build_services(settings, tracing)
        worker = services.worker
        metrics = Metrics(lambda: worker.depth, services.limiter.stats, worker)
        live = LiveSeries()
        services.recorder.listeners += [metrics.observe, live.observe, log_request]
        app.state.services, app.state.metrics, app.state.live = services, metrics, live
        try:
            yield
        finally:
            await services.close()
            if owned:
                tracing.shutdown()

    routes = [*openai.ROUTES, *admin.ROUTES, *audit.ROUTES, *audit_log.ROUTES, *ops.ROUTES]
    app = Litestar(
        route_handlers=routes + (console.ROUTES if settings.console else []),
        plugins=http_tracing(provider),
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_body_bytes,
        before_request=strict.strict_query,
        openapi_config=OpenAPIConfig(
            title="Speculative LLM gateway", version="0.1.0", path="/schema"
        ),
    )
    contract.document(app.openapi_schema)
    app.state.query_names = strict.query_names(app.openapi_schema)
    return app
