"""The frozen objects that cross the http -> serving seam (SamplingParams is the engine's,
re-exported: the command carries it as the one typed set of sampling parameters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.engine import SamplingParams

__all__ = ["DecodingOverride", "Endpoint", "Generate", "Principal", "RequestMeta", "SamplingParams"]

Endpoint = Literal["chat.completions", "completions"]


@dataclass(frozen=True)
class Principal:
    """Who is calling: the admin, a tenant inference key, or a tenant auditor key."""

    role: Literal["admin", "tenant", "auditor"]
    tenant_id: str | None
    key_id: str | None


@dataclass(frozen=True)
class RequestMeta:
    request_id: str
    endpoint: str
    received_at: float
    """time.perf_counter() when the request arrived (latency and TTFT start here)."""


@dataclass(frozen=True)
class DecodingOverride:
    mode: Literal["auto", "speculative", "standard"] = "auto"
    proposer: Literal["draft", "prompt_lookup", "prediction"] | None = None
    k: int | None = None


@dataclass(frozen=True)
class Generate:
    """One generation request, already checked for shape by the HTTP layer."""

    endpoint: Endpoint
    model: str
    messages: tuple[dict[str, str], ...] | None = None
    prompt: str | tuple[int, ...] | None = None
    max_tokens: int | None = None
    """None: the endpoint's default (gateway.limits.DEFAULT_MAX_TOKENS), capped by the context."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """The engine's sampling parameters as the client set them (temperature, top_p, top_k,
    stop, seed, logprobs, logit_bias...). max_tokens and the tenant's token lists are filled
    in when the request runs."""
    prediction: str | None = None
    response_format: dict[str, Any] | None = None
    decoding: DecodingOverride | None = None
    stream: bool = False
    include_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def constraint(self) -> str:
        """none | json_object | json_schema | logit_bias (what the audit record names)."""
        rf = self.response_format
        if rf and rf.get("type") in ("json_object", "json_schema"):
            return str(rf["type"])
        return "logit_bias" if self.sampling.logit_bias else "none"
