"""How a request ended, as the recorder needs it."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.serving.errors import GatewayError


@dataclass(frozen=True)
class Outcome:
    status: int
    """HTTP status the client saw (499: the client went away mid-stream)."""
    error: GatewayError | None = None
