"""The audit log's tables. Append-only, hash-chained: ``audit_records`` (one HTTP request,
served or refused), ``audit_admissions`` (a request admitted to run, written before its
first output byte) and ``admin_events`` (PostgreSQL and SQLite triggers refuse
UPDATE/DELETE/TRUNCATE). Purgeable: ``audit_payloads`` (a record's prompt and completion
text, kept only when tenant policy asks)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gateway.database.columns import Base, BigId, PayloadText, UTCDateTime, table_of


class AuditRecordRow(Base):
    """One HTTP inference request (served or refused); hash-chained, append-only."""

    __tablename__ = "audit_records"
    __table_args__ = (
        Index("ix_audit_records_tenant_id_id", "tenant_id", "id"),
        Index("ix_audit_records_created_at", "created_at"),
        Index("ix_audit_records_decision_id", "decision_id"),
        Index("ix_audit_records_request_id", "request_id"),
        Index("ix_audit_records_user_sha256", "user_sha256"),
        Index("ix_audit_records_trace_id", "trace_id"),
        Index("ix_audit_records_admission_id", "admission_id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    """Monotonically increasing; chain order."""
    request_id: Mapped[str] = mapped_column(String(64))
    """The gateway's id of the HTTP request (also returned to the client)."""
    decision_id: Mapped[str | None] = mapped_column(String(64))
    """The policy decision's id; null when refused before a decision."""
    tenant_id: Mapped[str | None] = mapped_column(String(64))
    """Calling tenant; null only when authentication failed."""
    key_id: Mapped[str | None] = mapped_column(String(64))
    """API key used."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When the request finished (UTC)."""
    endpoint: Mapped[str] = mapped_column(String(128))
    """HTTP route, e.g. ``/v1/chat/completions``."""
    status: Mapped[int] = mapped_column(Integer)
    """HTTP status returned."""
    error_type: Mapped[str | None] = mapped_column(String(64))
    """OpenAI-style error type when refused or failed."""
    requested_mode: Mapped[str | None] = mapped_column(String(16))
    """What the client asked for: auto, speculative or standard."""
    mode: Mapped[str | None] = mapped_column(String(16))
    """speculative | standard; null when refused before decoding."""
    reason_codes: Mapped[list[str]] = mapped_column(JSON)
    """Policy reason codes (JSON list)."""
    policy_revision: Mapped[str | None] = mapped_column(String(64))
    """Content hash of the policy bundle that decided."""
    target_model: Mapped[str | None] = mapped_column(String(128))
    """Target model name."""
    target_version: Mapped[str | None] = mapped_column(String(64))
    """Target model version."""
    target_sha256: Mapped[str | None] = mapped_column(String(64))
    """Digest of the target weights."""
    proposer: Mapped[str | None] = mapped_column(String(16))
    """draft | prompt_lookup | prediction | suffix; null for standard decoding."""
    draft_model: Mapped[str | None] = mapped_column(String(128))
    """Draft model name (proposer=draft)."""
    draft_version: Mapped[str | None] = mapped_column(String(64))
    """Draft model version."""
    draft_sha256: Mapped[str | None] = mapped_column(String(64))
    """Digest of the draft weights."""
    k_min: Mapped[int | None] = mapped_column(Integer)
    """Lower bound on tokens drafted per step."""
    k_max: Mapped[int | None] = mapped_column(Integer)
    """Upper bound on tokens drafted per step."""
    drafted_tokens: Mapped[int] = mapped_column(Integer)
    """Draft tokens proposed (counts only; rejected tokens are never stored)."""
    accepted_tokens: Mapped[int] = mapped_column(Integer)
    """Draft tokens the verifier kept."""
    temperature: Mapped[float | None] = mapped_column(Float)
    """Sampling temperature."""
    top_p: Mapped[float | None] = mapped_column(Float)
    """Nucleus sampling mass."""
    top_k: Mapped[int | None] = mapped_column(Integer)
    """Top-k cut."""
    seed: Mapped[int | None] = mapped_column(BigInteger)
    """Client seed."""
    constraint: Mapped[str | None] = mapped_column(String(16))
    """none | json_object | json_schema | tools | logit_bias."""
    constraint_sha256: Mapped[str | None] = mapped_column(String(64))
    """Digest of the constraint spec (schema / bias map)."""
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    """Prompt length in target tokens."""
    completion_tokens: Mapped[int] = mapped_column(Integer)
    """Tokens emitted."""
    latency_ms: Mapped[float | None] = mapped_column(Float)
    """Total request latency."""
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    """Time to first token."""
    prompt_sha256: Mapped[str | None] = mapped_column(String(64))
    """SHA-256 of the prompt text (links the purgeable payload to the chain)."""
    completion_sha256: Mapped[str | None] = mapped_column(String(64))
    """SHA-256 of the completion text."""
    user_sha256: Mapped[str | None] = mapped_column(String(64))
    """SHA-256 of the request's ``user`` (end-user id); the plain value is never stored, so
    attribution outlives payload retention without keeping personal data (revision 0002)."""
    tool_calls: Mapped[int | None] = mapped_column(Integer)
    """Tool calls the response made (null: the request sent no callable tools)."""
    tool_names: Mapped[list[str] | None] = mapped_column(JSON)
    """Names of the functions called, in call order (never their arguments)."""
    trace_id: Mapped[str | None] = mapped_column(String(32))
    """OpenTelemetry trace id of the request (32 hex digits; null with tracing off); hashed
    into the chain when set (revision 0004_trace_id)."""
    admission_id: Mapped[int | None] = mapped_column(BigInteger)
    """The ``audit_admissions`` row this record completes (written before the request's
    first output byte); null for a request refused before admission and for records older
    than revision 0005_admission_records. Hashed into the chain when set."""
    reasoning_tokens: Mapped[int | None] = mapped_column(Integer)
    """A thinking model's thinking tokens, tags included (null: the model does not think);
    hashed into the chain when set (revision 0007_reasoning_tokens)."""
    prev_hash: Mapped[str] = mapped_column(String(64))
    """record_hash of the previous record (64 zeros for the first)."""
    record_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """SHA-256 of this record's canonical encoding, prev_hash included."""


class AuditAdmissionRow(Base):
    """A request admitted to run: written, durable, before its first output byte leaves
    (record first, act second). The request's final ``audit_records`` row completes it
    (``audit_records.admission_id``); an admission that no record completes is an
    incomplete request (its final write failed, or the process died). Hash-chained (own
    chain), append-only (revision 0005_admission_records)."""

    __tablename__ = "audit_admissions"
    __table_args__ = (
        Index("ix_audit_admissions_request_id", "request_id"),
        Index("ix_audit_admissions_tenant_id_id", "tenant_id", "id"),
        Index("ix_audit_admissions_created_at", "created_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    """Monotonically increasing; chain order."""
    request_id: Mapped[str] = mapped_column(String(64))
    """The gateway's id of the HTTP request (also returned to the client)."""
    tenant_id: Mapped[str] = mapped_column(String(64))
    """Calling tenant."""
    key_id: Mapped[str | None] = mapped_column(String(64))
    """API key used."""
    endpoint: Mapped[str] = mapped_column(String(128))
    """HTTP route."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When the request was admitted (UTC)."""
    decision_id: Mapped[str] = mapped_column(String(64))
    """The policy decision's id."""
    mode: Mapped[str] = mapped_column(String(16))
    """speculative | standard."""
    proposer: Mapped[str | None] = mapped_column(String(16))
    """draft | prompt_lookup | prediction | suffix; null for standard decoding."""
    reason_codes: Mapped[list[str]] = mapped_column(JSON)
    """Policy reason codes (JSON list)."""
    policy_revision: Mapped[str | None] = mapped_column(String(64))
    """Content hash of the policy bundle that decided."""
    target_model: Mapped[str] = mapped_column(String(128))
    """Target model name."""
    target_version: Mapped[str] = mapped_column(String(64))
    """Target model version."""
    target_sha256: Mapped[str | None] = mapped_column(String(64))
    """Digest of the target weights."""
    draft_model: Mapped[str | None] = mapped_column(String(128))
    """Draft model name (proposer=draft)."""
    draft_version: Mapped[str | None] = mapped_column(String(64))
    """Draft model version."""
    draft_sha256: Mapped[str | None] = mapped_column(String(64))
    """Digest of the draft weights."""
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    """Prompt length in target tokens."""
    prompt_sha256: Mapped[str] = mapped_column(String(64))
    """SHA-256 of the prompt text (the final record's prompt_sha256 is the same)."""
    trace_id: Mapped[str | None] = mapped_column(String(32))
    """OpenTelemetry trace id (hashed when set)."""
    prev_hash: Mapped[str] = mapped_column(String(64))
    """record_hash of the previous admission (64 zeros for the first)."""
    record_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """SHA-256 of this admission's canonical encoding, prev_hash included."""


class AuditPayloadRow(Base):
    """Prompt/completion text of one record, kept only when tenant policy asks; purgeable."""

    __tablename__ = "audit_payloads"
    __table_args__ = (Index("ix_audit_payloads_expires_at", "expires_at"),)

    record_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("audit_records.id"), primary_key=True, autoincrement=False
    )
    """The audit record this text belongs to."""
    prompt: Mapped[str] = mapped_column(PayloadText)
    """Prompt text (sha256 equals the record's prompt_sha256)."""
    completion: Mapped[str] = mapped_column(PayloadText)
    """Completion text (sha256 equals the record's completion_sha256)."""
    retention_days: Mapped[int] = mapped_column(Integer)
    """Retention asked by tenant policy."""
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """created_at + retention_days; purge deletes rows at or past it."""


class AdminEventRow(Base):
    """An administrative change; hash-chained (own chain), append-only."""

    __tablename__ = "admin_events"
    __table_args__ = (
        Index("ix_admin_events_created_at", "created_at"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    """Monotonically increasing; chain order."""
    actor: Mapped[str] = mapped_column(String(128))
    """Who did it (key id, operator name, ``system``)."""
    action: Mapped[str] = mapped_column(String(64))
    """tenant.created, key.revoked, policy.activated, rollout.promoted, ..."""
    subject: Mapped[str] = mapped_column(String(256))
    """What it was done to (tenant id, key id, ``target/draft@version`` ...)."""
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """State before the change (JSON), if any."""
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """State after the change (JSON), if any."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When (UTC)."""
    prev_hash: Mapped[str] = mapped_column(String(64))
    """record_hash of the previous event (64 zeros for the first)."""
    record_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """SHA-256 of this event's canonical encoding, prev_hash included."""


RECORDS = table_of(AuditRecordRow)
ADMISSIONS = table_of(AuditAdmissionRow)
PAYLOADS = table_of(AuditPayloadRow)
EVENTS = table_of(AdminEventRow)
