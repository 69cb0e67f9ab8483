"""Translate a request's decision, models and engine result into its audit records: the
admission (before the first output byte) and the final record that completes it.

serving is the only layer that sees both the policy decision and the audit store, so this
mapping lives here (DESIGN: the audit store never imports the policy package).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from gateway.database import Admission, RequestRecord
from gateway.database import sha256_text as _sha
from gateway.engine import DecodeResult
from gateway.serving.commands import Generate, Principal, RequestMeta
from gateway.serving.errors import GatewayError
from gateway.serving.outcome import Outcome


def _constraint(cmd: Generate | None) -> tuple[str, str | None]:
    if cmd is None:
        return "none", None
    kind = cmd.constraint
    if kind == "tools" and cmd.tools is not None:
        return kind, _sha(json.dumps(cmd.tools.definitions, sort_keys=True, separators=(",", ":")))
    if kind in ("json_object", "json_schema"):
        return kind, _sha(json.dumps(cmd.response_format, sort_keys=True, separators=(",", ":")))
    if kind == "logit_bias":
        return kind, _sha(json.dumps(sorted(cmd.sampling.logit_bias)))
    return kind, None


def _requested_mode(cmd: Generate | None) -> str | None:
    return cmd.decoding.mode if cmd and cmd.decoding else None


def request_fields(
    meta: RequestMeta,
    principal: Principal | None,
    cmd: Generate | None,
    status: int,
    error: GatewayError | None,
) -> dict[str, Any]:
    constraint, constraint_sha = _constraint(cmd)
    return {
        "request_id": meta.request_id,
        "endpoint": meta.endpoint,
        "status": status,
        "error_type": error.kind if error else None,
        "tenant_id": principal.tenant_id if principal else None,
        "key_id": principal.key_id if principal else None,
        "requested_mode": _requested_mode(cmd),
        "temperature": cmd.sampling.temperature if cmd else None,
        "top_p": cmd.sampling.top_p if cmd else None,
        "top_k": cmd.sampling.top_k if cmd else None,
        "seed": cmd.sampling.seed if cmd else None,
        "constraint": constraint,
        "constraint_sha256": constraint_sha,
        "latency_ms": round((time.perf_counter() - meta.received_at) * 1000, 3),
        "user_sha256": _sha(cmd.user) if cmd and cmd.user is not None else None,
        "trace_id": meta.trace_id,
    }


def refused_record(
    meta: RequestMeta,
    principal: Principal | None,
    cmd: Generate | None,
    status: int,
    error: GatewayError,
) -> RequestRecord:
    return RequestRecord(**request_fields(meta, principal, cmd, status, error))


@dataclass(frozen=True, kw_only=True)
class ServedRequest:
    """A started request as its final audit record sees it: who asked, what the policy
    decided (``decision``) and which models served it (``target``, ``draft``: manifest
    entries), the prompt, and what came out."""

    meta: RequestMeta
    principal: Principal
    cmd: Generate
    decision: Any
    target: Any
    draft: Any | None
    prompt_text: str
    prompt_tokens: int
    result: DecodeResult | None
    """The choices' merged output; None when the request ended before every choice did."""
    completion_text: str
    first_token_at: float | None
    """perf_counter() at the first output token, if one came."""
    tool_names: tuple[str, ...] = ()
    admission_id: int | None = None
    reasoning_tokens: int | None = None


def served_record(served: ServedRequest, outcome: Outcome) -> RequestRecord:
    """The final record of a started request, which completes its admission."""
    stats = served.result.stats if served.result else None
    speculative = served.decision.mode == "speculative"
    ttft = None
    if served.first_token_at is not None:
        ttft = round((served.first_token_at - served.meta.received_at) * 1000, 3)
    tools = served.cmd.constraint == "tools"
    return RequestRecord(
        **request_fields(served.meta, served.principal, served.cmd, outcome.status, outcome.error),
        **decision_fields(served.decision, served.target, served.draft),
        k_min=served.decision.k_min if speculative else None,
        k_max=served.decision.k_max if speculative else None,
        drafted_tokens=stats.drafted if stats else 0,
        accepted_tokens=stats.accepted if stats else 0,
        prompt_tokens=served.prompt_tokens,
        completion_tokens=len(served.result.token_ids) if served.result else 0,
        ttft_ms=ttft,
        prompt_sha256=_sha(served.prompt_text),
        completion_sha256=_sha(served.completion_text),
        tool_calls=len(served.tool_names) if tools else None,
        tool_names=served.tool_names if tools else None,
        admission_id=served.admission_id,
        reasoning_tokens=served.reasoning_tokens,
    )


def decision_fields(decision: Any, target: Any, draft: Any | None) -> dict[str, Any]:
    """What the admission and the final record both say of the decision and the models."""
    speculative = decision.mode == "speculative"
    return {
        "decision_id": decision.decision_id,
        "mode": decision.mode,
        "proposer": decision.proposer if speculative else None,
        "reason_codes": tuple(decision.reason_codes),
        "policy_revision": decision.policy_revision,
        "target_model": target.name,
        "target_version": target.version,
        "target_sha256": target.sha256,
        "draft_model": draft.name if draft else None,
        "draft_version": draft.version if draft else None,
        "draft_sha256": draft.sha256 if draft else None,
    }


def admission_record(
    *,
    meta: RequestMeta,
    principal: Principal,
    decision: Any,
    target: Any,
    draft: Any | None,
    prompt_text: str,
    prompt_tokens: int,
) -> Admission:
    """What is durable before the first output byte: who, the decision, the models, the
    prompt's digest (the final record repeats them and adds the outcome)."""
    assert principal.tenant_id is not None
    return Admission(
        request_id=meta.request_id,
        tenant_id=principal.tenant_id,
        key_id=principal.key_id,
        endpoint=meta.endpoint,
        **decision_fields(decision, target, draft),
        prompt_tokens=prompt_tokens,
        prompt_sha256=_sha(prompt_text),
        trace_id=meta.trace_id,
    )
