"""OpenAI's error shape for every failure: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from gateway.serving.errors import STATUS_OF_KIND, GatewayError

STATUS = STATUS_OF_KIND
TYPE = {
    "invalid_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "conflict": "conflict_error",
    "rate_limited": "rate_limit_error",
    "overloaded": "overloaded_error",
    "unavailable": "service_unavailable_error",
    "internal": "server_error",
}


def error_body(err: GatewayError) -> dict[str, Any]:
    return {
        "error": {
            "message": err.message,
            "type": TYPE[err.kind],
            "param": err.param,
            "code": err.code,
        }
    }


def error_response(err: GatewayError, headers: dict[str, str] | None = None) -> Response[Any]:
    h = dict(headers or {})
    if err.retry_after is not None:
        h["retry-after"] = str(err.retry_after)
    return Response(content=error_body(err), status_code=STATUS[err.kind], headers=h)


def on_gateway_error(_: Request[Any, Any, Any], exc: GatewayError) -> Response[Any]:
    return error_response(exc)


def on_too_large(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """413: a body over the size limit (GATEWAY_MAX_BODY_BYTES), refused as it arrives."""
    limit = request.route_handler.resolve_request_max_body_size()
    body = {
        "error": {
            "message": f"the request body is larger than the limit of {limit} bytes",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }
    return Response(content=body, status_code=413, headers=exc.headers)


def on_http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    if exc.status_code == 413:
        return on_too_large(request, exc)
    kind = {
        400: "invalid_request",
        401: "authentication",
        403: "permission",
        404: "not_found",
        409: "conflict",
        429: "rate_limited",
        503: "unavailable",
    }.get(exc.status_code)
    message, param = exc.detail, None
    if isinstance(exc, ValidationException) and exc.extra:
        first = exc.extra[0] if isinstance(exc.extra, list) else None
        if isinstance(first, dict) and "key" in first:  # Litestar's parameter validation
            message, param = f"{exc.detail}: {first.get('message')}", first["key"]
        else:
            message = f"{exc.detail}: {exc.extra}"
    if kind is None:
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error" if exc.status_code < 500 else "server_error",
                "param": param,
                "code": None,
            }
        }
        return Response(content=body, status_code=exc.status_code, headers=exc.headers)
    err = GatewayError(kind, str(message), param=param)  # type: ignore[arg-type]
    return error_response(err, exc.headers)


def on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    request.logger.exception("unhandled error", exc_info=exc)
    return error_response(GatewayError("internal", "internal error; the request id names it"))


EXCEPTION_HANDLERS: dict[Any, Any] = {
    GatewayError: on_gateway_error,
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}
