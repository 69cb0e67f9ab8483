"""Health, readiness and Prometheus metrics."""

from __future__ import annotations

import hmac
from typing import Any

from litestar import Request, Response, get

from gateway.database import sha256_text as _sha
from gateway.serving import Services


@get("/health", summary="Liveness", sync_to_thread=False)
def health() -> dict[str, str]:
    return {"status": "ok"}


@get("/ready", summary="Readiness: models loaded and the database reachable")
async def ready(request: Request[Any, Any, Any]) -> Response[Any]:
    svc: Services = request.app.state.services
    checks = await svc.readiness()
    ok = all(checks.values())
    return Response({"ready": ok, "checks": checks}, status_code=200 if ok else 503)


@get("/metrics", summary="Prometheus metrics", include_in_schema=False)
async def metrics(request: Request[Any, Any, Any]) -> Response[Any]:
    svc: Services = request.app.state.services
    required = svc.settings.metrics_key
    if required is not None:
        sent = request.headers.get("authorization") or ""
        token = sent[7:].strip() if sent.lower().startswith("bearer ") else ""
        if not (token and hmac.compare_digest(_sha(token), _sha(required))):
            await svc.auth.admin(sent or None)  # the admin key works too; else 401/403
    return Response(
        request.app.state.metrics.render(),
        media_type="text/plain; version=0.0.4; charset=utf-8",
    )


ROUTES = [health, ready, metrics]
