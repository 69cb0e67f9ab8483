"""The OpenAPI document as the contract: what Litestar derives from the handlers, completed
with what it cannot see.

- Request bodies that are msgspec structs are documented with msgspec's own JSON schema
  (`body_reference`), so every constraint the decoder enforces (``Meta`` bounds, lengths,
  patterns, unknown fields) is in the document, nested ones too.
- Every operation lists the statuses it answers with; each 4xx/5xx carries OpenAI's error
  shape (`ErrorResponse`), the streaming endpoints their ``text/event-stream`` and the
  export its JSON lines / CSV.
- The bearer key is a security scheme; links join the operations that create a resource
  to those that use it (tenant -> key -> revoke, rollout -> get / action, records -> record).

`document` runs once on the app's OpenAPI object (gateway.asgi), before it is served.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar.openapi.spec import OpenAPI, Reference

REF = "#/components/schemas/{name}"
_BODIES: dict[str, type[msgspec.Struct]] = {}


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    """invalid_request_error, authentication_error, permission_error, not_found_error,
    conflict_error, rate_limit_error, overloaded_error, service_unavailable_error or
    server_error."""
    param: str | None
    """The offending parameter (a body path such as ``messages[0].role``), if any."""
    code: str | None


class ErrorResponse(msgspec.Struct, kw_only=True):
    """OpenAI's error shape: every 4xx and 5xx answer has this body."""

    error: ErrorDetail


def body_reference(kind: type[msgspec.Struct]) -> Reference:
    """The request body schema of a struct: a reference to its component, which `document`
    fills with msgspec's JSON schema of it."""
    _BODIES[kind.__name__] = kind
    return Reference(ref=REF.format(name=kind.__name__))


_REASON = {
    400: "Invalid request (the error names `param`)",
    401: "Missing or invalid API key",
    403: "The key's role may not call this operation",
    404: "No such model or resource",
    409: "The resource exists already or is in another state",
    429: "Rate limited (retry-after says when to retry)",
    500: "Internal error (x-request-id names it in the logs)",
    503: "Overloaded, or the audit store or a model is unavailable",
}
_AUTHENTICATED = {400, 401, 403, 500}
STATUSES: dict[str, set[int]] = {
    "/v1/chat/completions": _AUTHENTICATED | {404, 429, 503},
    "/v1/completions": _AUTHENTICATED | {404, 429, 503},
    "/v1/models": _AUTHENTICATED,
    "/tokenize": _AUTHENTICATED | {404, 429, 503},
    "/admin/": _AUTHENTICATED | {404, 409, 503},
    "/audit/": _AUTHENTICATED | {404, 503},
    "/health": set(),
    "/ready": {503},
}
"""Error statuses by path (a prefix ends with /)."""
_STREAMING = {"/v1/chat/completions", "/v1/completions"}
_EVENT_STREAM = {
    "schema": {
        "type": "object",
        "description": "One server-sent event (stream: true): each `data` is a chunk's JSON, "
        "then the usage chunk when stream_options.include_usage, then `[DONE]`.",
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
        "required": ["data"],
    }
}
"""Each event of the stream, as OpenAPI 3.2 and schemathesis read an SSE media type's schema."""
_EXPORT = {
    "application/x-ndjson": {"schema": {"type": "string", "description": "JSON lines."}},
    "text/csv": {"schema": {"type": "string", "description": "CSV with a header row."}},
}

# (path, method) of the operation whose answer links -> {link name: (path, method, params)}
_LINKS: dict[tuple[str, str], dict[str, tuple[str, str, dict[str, str]]]] = {
    ("/admin/tenants", "post"): {
        "CreateKey": (
            "/admin/tenants/{tenant_id}/keys",
            "post",
            {"tenant_id": "$response.body#/id"},
        ),
        "PutTenantPolicy": (
            "/admin/policies/tenants/{tenant_id}",
            "put",
            {"tenant_id": "$response.body#/id"},
        ),
    },
    ("/admin/tenants/{tenant_id}/keys", "post"): {
        "RevokeKey": ("/admin/keys/{key_id}", "delete", {"key_id": "$response.body#/id"}),
    },
    ("/admin/rollouts", "post"): {
        "GetRollout": ("/admin/rollouts/{rollout_id}", "get", {"rollout_id": "$response.body#/id"}),
        "ActOnRollout": (
            "/admin/rollouts/{rollout_id}/{action}",
            "post",
            {"rollout_id": "$response.body#/id"},
        ),
    },
    ("/audit/records", "get"): {
        "GetRecord": (
            "/audit/records/{record_id}",
            "get",
            {"record_id": "$response.body#/data/0/id"},
        ),
    },
}


def _statuses(path: str) -> set[int]:
    for prefix, codes in STATUSES.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return codes
    raise KeyError(f"{path}: add its error statuses to gateway.http.contract.STATUSES")


def document(openapi: OpenAPI) -> None:
    """Complete the app's OpenAPI object in place (see the module docstring)."""
    _, components = msgspec.json.schema_components(
        [*_BODIES.values(), ErrorResponse], ref_template=REF
    )
    schemas: dict[str, Any] = openapi.components.schemas
    schemas.update(components)
    openapi.components.security_schemes = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "An API key."}  # type: ignore[dict-item]
    }
    error = {"application/json": {"schema": {"$ref": REF.format(name="ErrorResponse")}}}
    ids = {
        (path, method): op.operation_id
        for path, item in (openapi.paths or {}).items()
        for method, op in _operations(item)
    }
    for path, item in (openapi.paths or {}).items():
        for method, op in _operations(item):
            responses: dict[str, Any] = op.responses or {}
            for code in sorted(_statuses(path)):
                responses[str(code)] = {"description": _REASON[code], "content": error}
            if path not in ("/health", "/ready"):
                op.security = [{"bearer": []}]
            ok = next(r for code, r in responses.items() if code.startswith("2"))
            if path in _STREAMING:
                ok.content["text/event-stream"] = _EVENT_STREAM  # type: ignore[index,assignment]
            if path == "/audit/export":
                ok.content = _EXPORT  # type: ignore[assignment]
            links = _LINKS.get((path, method), {})
            if links:
                ok.links = {
                    name: {"operationId": ids[to, verb], "parameters": params}  # type: ignore[misc]
                    for name, (to, verb, params) in links.items()
                }
            op.responses = responses


def _operations(item: Any) -> list[tuple[str, Any]]:
    methods = ("get", "put", "post", "delete", "patch")
    return [(m, op) for m in methods if (op := getattr(item, m, None)) is not None]
