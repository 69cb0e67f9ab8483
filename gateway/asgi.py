"""Composition root: create_app(settings) builds the Litestar app. The only module that
sees every layer; keep it short."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.openapi import OpenAPIConfig

from gateway.http import admin, audit, contract, openai, ops, strict
from gateway.http.errors import EXCEPTION_HANDLERS
from gateway.http.logging import configure, log_request
from gateway.http.metrics import Metrics
from gateway.serving import build_services
from gateway.settings import Settings


def create_app(settings: Settings | None = None) -> Litestar:
    settings = settings or Settings.from_env()
    configure(settings.log_level)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        services = await build_services(settings)
        metrics = Metrics(lambda: services.worker.depth, services.limiter.stats)
        services.recorder.listeners += [metrics.observe, log_request]
        app.state.services, app.state.metrics = services, metrics
        try:
            yield
        finally:
            await services.close()

    app = Litestar(
        route_handlers=[*openai.ROUTES, *admin.ROUTES, *audit.ROUTES, *ops.ROUTES],
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        before_request=strict.strict_query,
        openapi_config=OpenAPIConfig(
            title="Speculative LLM gateway", version="0.1.0", path="/schema"
        ),
    )
    contract.document(app.openapi_schema)
    app.state.query_names = strict.query_names(app.openapi_schema)
    return app
