"""Query strings as strict as bodies: a query parameter an operation does not declare is a
400 naming it (OpenAI answers unknown arguments so; silently ignoring a misspelt filter
would return the wrong records). The declared names come from the OpenAPI document, so
what is published and what is accepted cannot disagree."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.openapi.spec import OpenAPI

from gateway.serving.errors import invalid

_METHODS = ("get", "put", "post", "delete", "patch")


def query_names(document: OpenAPI) -> dict[tuple[str, str], frozenset[str]]:
    """(path template, METHOD) -> the query parameters the operation declares."""
    out: dict[tuple[str, str], frozenset[str]] = {}
    for path, item in (document.paths or {}).items():
        for method in _METHODS:
            op = getattr(item, method, None)
            if op is None:
                continue
            names = {p.name for p in op.parameters or () if getattr(p, "param_in", None) == "query"}
            out[(path, method.upper())] = frozenset(names)
    return out


async def strict_query(request: Request[Any, Any, Any]) -> None:
    """before_request hook: refuse an undeclared query parameter (operations outside the
    document, such as /schema itself, are left alone)."""
    declared = request.app.state.get("query_names", {})
    allowed = declared.get((request.scope.get("path_template"), request.method))
    if allowed is None:
        return
    for name in request.query_params:
        if name not in allowed:
            hint = f" (allowed: {', '.join(sorted(allowed))})" if allowed else ""
            raise invalid(f"unknown query parameter '{name}'{hint}", name)
