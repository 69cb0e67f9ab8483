"""The operator console: one static page (HTML + JS, uPlot vendored, no build step) at
/console, over the JSON API the gateway already publishes, plus two small reads of its
own: who the key is, and the live series (gateway/http/live.py).

The page holds the key in the tab's sessionStorage and sends it as a bearer key like any
client; every permission is the API's (an auditor key gets 403 from admin routes whatever
the page shows). These routes stay out of the OpenAPI document: they are the console's,
not the product API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from litestar import Request, Response, get
from litestar.static_files import create_static_files_router

from gateway.http.live import BUCKET_S, LiveSeries
from gateway.serving import Services
from gateway.serving.errors import GatewayError, invalid

STATIC = Path(__file__).resolve().parent / "console"
SECURITY_HEADERS = {
    # Everything the page needs is served from here: no CDN, no inline script.
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'"
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


static = create_static_files_router(
    path="/console/static",
    directories=[STATIC],
    include_in_schema=False,
    name="console-static",
)

ROUTES = [console_page, whoami, live, static]
