"""Plain data crossing the audit seam: what the service layer hands the store.

Every type here is a frozen value object. The store never receives policy or engine objects;
``gateway.serving`` maps its decision and run statistics into a :class:`RequestRecord`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

MODES = frozenset({"speculative", "standard"})
REQUESTED_MODES = frozenset({"auto", "speculative", "standard"})
PROPOSERS = frozenset({"draft", "prompt_lookup", "prediction", "suffix"})
CONSTRAINTS = frozenset({"none", "json_object", "json_schema", "tools", "logit_bias"})
KEY_ROLES = frozenset({"tenant", "auditor"})
OPERATOR_ROLES = frozenset({"admin", "policy-author", "rollout-operator", "auditor"})
"""Roles of named operators (principals); what each may do is gateway.serving.auth's."""
_TRACE_ID = re.compile(r"[0-9a-f]{32}")


class AuditUnavailable(Exception):
    """The store could not durably write; the caller must refuse to serve (fail closed)."""


class TenantExists(Exception):
    """``create_tenant`` was given an id that is already taken."""


def sha256_text(text: str) -> str:
    """Hex SHA-256 of ``text`` encoded as UTF-8: how prompt/completion digests are computed."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """One HTTP inference request, served or refused. Rejected draft tokens are never stored.

    ``created_at`` defaults to the time of ``append``; a given value must be timezone-aware.
    """

    request_id: str
    endpoint: str
    status: int
    decision_id: str | None = None
    tenant_id: str | None = None
    key_id: str | None = None
    created_at: datetime | None = None
    error_type: str | None = None
    requested_mode: str | None = None
    mode: str | None = None
    reason_codes: Sequence[str] = ()
    policy_revision: str | None = None
    target_model: str | None = None
    target_version: str | None = None
    target_sha256: str | None = None
    proposer: str | None = None
    draft_model: str | None = None
    draft_version: str | None = None
    draft_sha256: str | None = None
    k_min: int | None = None
    k_max: int | None = None
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    constraint: str | None = "none"
    constraint_sha256: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float | None = None
    ttft_ms: float | None = None
    prompt_sha256: str | None = None
    completion_sha256: str | None = None
    user_sha256: str | None = None
    tool_calls: int | None = None
    tool_names: Sequence[str] | None = None
    trace_id: str | None = None
    admission_id: int | None = None
    """The admission this final record completes (``Admission``, written before the
    request's first output byte); None for a request refused before admission."""
    reasoning_tokens: int | None = None
    """A thinking model's thinking tokens, tags included; None: the model does not think."""

    def __post_init__(self) -> None:
        _check(100 <= self.status <= 599, f"status {self.status} is not an HTTP status")
        _check(self.mode is None or self.mode in MODES, f"unknown mode {self.mode!r}")
        _check(
            self.requested_mode is None or self.requested_mode in REQUESTED_MODES,
            f"unknown requested_mode {self.requested_mode!r}",
        )
        _check(
            self.proposer is None or self.proposer in PROPOSERS,
            f"unknown proposer {self.proposer!r}",
        )
        _check(
            self.constraint is None or self.constraint in CONSTRAINTS,
            f"unknown constraint {self.constraint!r}",
        )
        for name in ("drafted_tokens", "accepted_tokens", "prompt_tokens", "completion_tokens"):
            _check(getattr(self, name) >= 0, f"{name} must be >= 0")
        _check(
            self.reasoning_tokens is None or 0 <= self.reasoning_tokens <= self.completion_tokens,
            "reasoning_tokens must be between 0 and completion_tokens",
        )
        _check(
            self.accepted_tokens <= self.drafted_tokens,
            "accepted_tokens cannot exceed drafted_tokens",
        )
        _check(
            self.created_at is None or self.created_at.utcoffset() is not None,
            "created_at must be timezone-aware",
        )
        _check(not isinstance(self.reason_codes, str), "reason_codes must be a list of codes")
        _check(not isinstance(self.tool_names, str), "tool_names must be a list of names")
        _check(
            self.trace_id is None or _TRACE_ID.fullmatch(self.trace_id) is not None,
            "trace_id must be 32 lowercase hex digits",
        )
        _check(
            (self.tool_calls is None) == (self.tool_names is None)
            and (self.tool_names is None or len(self.tool_names) == self.tool_calls),
            "tool_calls must count tool_names",
        )


@dataclass(frozen=True, kw_only=True)
class Admission:
    """A request admitted to run, recorded before its first output byte leaves (record
    first, act second): who asked, what the policy decided, which models, the prompt's
    digest. The request's final :class:`RequestRecord` completes it (``admission_id``); an
    admission that no record completes is reported incomplete (``Database.verify``).

    ``created_at`` defaults to the time of ``append``; a given value must be timezone-aware.
    """

    request_id: str
    tenant_id: str
    endpoint: str
    decision_id: str
    mode: str
    target_model: str
    target_version: str
    prompt_sha256: str
    prompt_tokens: int = 0
    key_id: str | None = None
    created_at: datetime | None = None
    proposer: str | None = None
    reason_codes: Sequence[str] = ()
    policy_revision: str | None = None
    target_sha256: str | None = None
    draft_model: str | None = None
    draft_version: str | None = None
    draft_sha256: str | None = None
    trace_id: str | None = None

    def __post_init__(self) -> None:
        _check(self.mode in MODES, f"unknown mode {self.mode!r}")
        _check(
            self.proposer is None or self.proposer in PROPOSERS,
            f"unknown proposer {self.proposer!r}",
        )
        _check(self.prompt_tokens >= 0, "prompt_tokens must be >= 0")
        _check(
            self.created_at is None or self.created_at.utcoffset() is not None,
            "created_at must be timezone-aware",
        )
        _check(not isinstance(self.reason_codes, str), "reason_codes must be a list of codes")
        _check(
            self.trace_id is None or _TRACE_ID.fullmatch(self.trace_id) is not None,
            "trace_id must be 32 lowercase hex digits",
        )


@dataclass(frozen=True)
class Payload:
    """Prompt and completion text, kept ``retention_days`` and then purged."""

    prompt: str
    completion: str
    retention_days: int

    def __post_init__(self) -> None:
        _check(self.retention_days >= 0, "retention_days must be >= 0")


@dataclass(frozen=True)
class AdminEvent:
    """One administrative change (``tenant.created``, ``rollout.promoted`` ...)."""

    actor: str
    action: str
    subject: str
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    created_at: datetime | None = None

    def __post_init__(self) -> None:
        _check(
            self.created_at is None or self.created_at.utcoffset() is not None,
            "created_at must be timezone-aware",
        )


@dataclass(frozen=True)
class RecordFilter:
    """Conjunctive filter over audit records; ``None`` means "any". ``since`` inclusive,
    ``until`` exclusive."""

    tenant_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    mode: str | None = None
    target_model: str | None = None
    target_version: str | None = None
    draft_model: str | None = None
    draft_version: str | None = None
    status: int | None = None
    decision_id: str | None = None
    user_sha256: str | None = None
    """SHA-256 of the end-user id (`sha256_text(user)`)."""
    trace_id: str | None = None
    """The request's OpenTelemetry trace id."""


@dataclass(frozen=True)
class KeyInfo:
    """What authentication learns from an API key; never the secret."""

    id: str
    tenant_id: str | None
    role: str
    revoked: bool
    principal: str | None = None
    """The named operator owning the key (None: a tenant or tenant-auditor key)."""
    expires_at: datetime | None = None
    last_used_at: datetime | None = None


@dataclass(frozen=True)
class WriterStats:
    """Counters of an :class:`~gateway.database.audit.writer.AuditWriter` (plain data)."""

    records: int = 0
    transactions: int = 0
    failures: int = 0
    largest_batch: int = 0


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
