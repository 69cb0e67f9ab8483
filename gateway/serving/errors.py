"""Errors the serving layer raises, by kind; gateway.http maps each kind to a status code
and OpenAI's error shape. Nothing here knows about HTTP."""

from __future__ import annotations

from typing import Literal

Kind = Literal[
    "invalid_request",  # 400
    "context_length",  # 400, prompt too long for the context
    "authentication",  # 401
    "permission",  # 403
    "not_found",  # 404
    "conflict",  # 409
    "rate_limited",  # 429
    "overloaded",  # 503
    "unavailable",  # 503 (audit store down, model not loaded)
    "internal",  # 500
]


STATUS_OF_KIND: dict[str, int] = {
    "invalid_request": 400,
    "context_length": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "conflict": 409,
    "rate_limited": 429,
    "overloaded": 503,
    "unavailable": 503,
    "internal": 500,
}
"""The HTTP status each kind answers with (the audit record stores it too)."""


class GatewayError(Exception):
    """An error with a kind, a message for the client and the offending parameter."""

    def __init__(
        self,
        kind: Kind,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: Kind = kind
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after


def invalid(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError("invalid_request", message, param=param, code=code)
