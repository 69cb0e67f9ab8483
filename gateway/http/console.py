"""The operator console: one static page (HTML + JS, uPlot vendored, no build step) at
/console, over the JSON API the gateway already publishes, plus two small reads of its
own: who the key is, and the live series (gateway/http/live.py).

The page holds the key in the tab's sessionStorage and sends it as a bearer key like any
client; every permission is the API's (an auditor key gets 403 from admin routes whatever
the page shows). These routes stay out of the OpenAPI document: they are the console's,
not the product API."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.static_files import create_static_files_router

from gateway.http.live import BUCKET_S, LiveSeries
from gateway.serving import Services
from gateway.serving.errors import GatewayError, invalid

STATIC = Path(__file__).resolve().parent / "console_static"
SECURITY_HEADERS = {
    # Everything the page needs is served from here: no CDN, no inline script (inline
    # styles are allowed: uPlot positions its legend and cursor with them).
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
MAX_WINDOW_S = 3600


def _svc(request: Request[Any, Any, Any]) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


@get("/console", include_in_schema=False, media_type="text/html")
async def console_page() -> Response[bytes]:
    return Response((STATIC / "index.html").read_bytes(), headers=SECURITY_HEADERS)


@get("/console/api/whoami", include_in_schema=False)
async def whoami(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The key's role and tenant; 403 for tenant inference keys (no console for them)."""
    p = await _svc(request).auth.auditor(request.headers.get("authorization"))
    return {"role": p.role, "tenant": p.tenant_id, "key_id": p.key_id}


@get("/console/api/live", include_in_schema=False)
async def live(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Admin key: ``?tenant=ID`` or ``?draft=name@version`` (``standard`` for rows with
    no draft), ``&window=seconds`` (<= 3600); without a selector, the names known."""
    await _svc(request).auth.admin(request.headers.get("authorization"))
    q = request.query_params
    unknown = set(q) - {"tenant", "draft", "window"}
    if unknown:
        name = sorted(unknown)[0]
        raise invalid(f"unknown query parameter '{name}' (allowed: draft, tenant, window)", name)
    raw = q.get("window", str(MAX_WINDOW_S))
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_WINDOW_S:
        raise invalid(f"window must be an integer in [1, {MAX_WINDOW_S}]", "window")
    series: LiveSeries = request.app.state.live
    if "tenant" in q and "draft" in q:
        raise GatewayError("invalid_request", "send tenant or draft, not both", param="draft")
    for kind in ("tenant", "draft"):
        if kind in q:
            return {
                "bucket_s": BUCKET_S,
                kind: q[kind],
                "data": series.series(kind, q[kind], int(raw)),
            }
    return {
        "bucket_s": BUCKET_S,
        "tenants": series.names("tenant"),
        "drafts": series.names("draft"),
    }


@get("/console/api/tenants/{tenant_id:str}/keys", include_in_schema=False)
async def tenant_keys(request: Request[Any, Any, Any], tenant_id: str) -> dict[str, Any]:
    """Admin key: a tenant's keys (id, role, prefix, created, revoked), never a secret."""
    svc = _svc(request)
    await svc.auth.admin(request.headers.get("authorization"))
    rows = await svc.store.list_keys(tenant_id)
    return {"data": [{k: _iso(v) for k, v in row.items()} for row in rows]}


@post("/console/api/policy/validate", status_code=200, include_in_schema=False)
async def validate_policy(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """Admin key: ``{"tenant", "document"}`` checked as PUT /admin/policies/tenants/{id}
    would check it, without activating or storing it."""
    svc = _svc(request)
    await svc.auth.admin(request.headers.get("authorization"))
    try:
        body = msgspec.json.decode(await request.body())
    except msgspec.DecodeError as exc:
        raise invalid(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict) or set(body) != {"tenant", "document"}:
        raise invalid('send {"tenant": "<id>", "document": {...}}', "tenant")
    tenant, document = body["tenant"], body["document"]
    if not isinstance(tenant, str) or not isinstance(document, dict):
        raise invalid("tenant must be a string and document a JSON object", "document")
    return svc.policy.validate_tenant(tenant, document)


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


static = create_static_files_router(
    path="/console/static",
    directories=[STATIC],
    include_in_schema=False,
    name="console-static",
)

ROUTES = [console_page, whoami, live, tenant_keys, validate_policy, static]
