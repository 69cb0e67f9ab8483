"""The frozen objects that cross the http -> serving seam (SamplingParams is the engine's,
re-exported: the command carries it as the one typed set of sampling parameters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.engine import SamplingParams
from gateway.engine.constraints import ToolSpec

__all__ = [
    "DecodingOverride",
    "Endpoint",
    "Generate",
    "Principal",
    "RequestMeta",
    "Role",
    "SamplingParams",
    "ToolSpec",
    "Tools",
]

Endpoint = Literal["chat.completions", "completions"]


Role = Literal["admin", "policy-author", "rollout-operator", "auditor", "tenant"]


@dataclass(frozen=True)
class Principal:
    """Who is calling: a named operator (the bootstrap key is the operator ``admin``), a
    tenant inference key, or a tenant auditor key (role auditor with its tenant_id)."""

    role: Role
    tenant_id: str | None
    key_id: str | None
    name: str | None = None
    """The operator's name (None for tenant keys): the actor of the admin events it causes."""

    @property
    def actor(self) -> str:
        return self.name or self.key_id or "unknown"


@dataclass(frozen=True)
class RequestMeta:
    request_id: str
    endpoint: str
    received_at: float
    """time.perf_counter() when the request arrived (latency and TTFT start here)."""
    trace_id: str | None = None
    """The request's OpenTelemetry trace id (32 hex digits) when tracing is on."""


@dataclass(frozen=True)
class DecodingOverride:
    mode: Literal["auto", "speculative", "standard"] = "auto"
    proposer: Literal["draft", "prompt_lookup", "prediction", "suffix"] | None = None
    k: int | None = None
    open_objects: bool = False
    """Objects a schema does not close may carry unnamed keys (the letter of JSON Schema);
    by default only the named properties are generated (constraints/objects.py)."""


@dataclass(frozen=True)
class Tools:
    """A chat request's tools and how the model may call them."""

    specs: tuple[ToolSpec, ...]
    definitions: tuple[dict[str, Any], ...]
    """The tools as OpenAI sent them (what the chat template presents to the model)."""
    choice: Literal["none", "auto", "required", "named"] = "auto"
    named: str | None = None
    """The one function a named tool_choice forces."""
    parallel: bool = True

    @property
    def callable(self) -> tuple[ToolSpec, ...]:
        """The functions the output may call (none with tool_choice "none")."""
        if self.choice == "none":
            return ()
        if self.choice == "named":
            return tuple(t for t in self.specs if t.name == self.named)
        return self.specs


@dataclass(frozen=True)
class Generate:
    """One generation request, already checked for shape by the HTTP layer."""

    endpoint: Endpoint
    model: str
    messages: tuple[dict[str, Any], ...] | None = None
    """Chat messages as the template takes them (role, content; an assistant's tool_calls
    with their arguments as objects; a tool message's tool_call_id)."""
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
    tools: Tools | None = None
    n: int = 1
    """Choices: each one decode row of its own."""
    user: str | None = None
    """The client's end-user id (OpenAI's ``user``)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def constraint(self) -> str:
        """none | json_object | json_schema | tools | logit_bias (what the audit record
        names)."""
        if self.tools is not None and self.tools.callable:
            return "tools"
        rf = self.response_format
        if rf and rf.get("type") in ("json_object", "json_schema"):
            return str(rf["type"])
        return "logit_bias" if self.sampling.logit_bias else "none"
