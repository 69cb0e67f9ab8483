"""ORM tables of the gateway: the one metadata Alembic migrates (``migrations/env.py``).

Append-only, hash-chained: ``audit_records``, ``audit_admissions`` and ``admin_events``
(PostgreSQL and SQLite triggers refuse UPDATE/DELETE/TRUNCATE). Purgeable:
``audit_payloads``. Plain mutable CRUD: ``tenants``, ``api_keys``, ``acceptance_stats``,
``model_versions``, ``rollouts``, ``policy_documents``. All timestamps are stored in UTC
and read back timezone-aware.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: 64-bit ids on PostgreSQL; SQLite needs INTEGER for its rowid alias.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in, timezone-aware UTC out, on every dialect."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
        return value.astimezone(UTC)  # type: ignore[no-any-return]


class PayloadText(TypeDecorator[str]):
    """Any Python str, on every dialect. PostgreSQL text cannot hold NUL, yet a model may
    emit it (byte-level tokenizers have a token for byte 0), and an unwritable completion
    would refuse the request (fail closed). So on PostgreSQL NUL is stored as "\u2400 0"
    (SYMBOL FOR NULL, then "0") and a literal U+2400 as two of them; reads undo both, so the
    text (and its SHA-256 in the chain) round-trips exactly. Text without either is stored
    unchanged."""

    impl = Text
    cache_ok = True
    _ESC = "\u2400"

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        if value is None or dialect.name != "postgresql":
            return value
        if "\x00" not in value and self._ESC not in value:
            return value
        return value.replace(self._ESC, self._ESC * 2).replace("\x00", self._ESC + "0")

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        if value is None or dialect.name != "postgresql" or self._ESC not in value:
            return value  # type: ignore[no-any-return]
        out, i = [], 0
        while i < len(value):
            ch = value[i]
            if ch == self._ESC and i + 1 < len(value):
                out.append("\x00" if value[i + 1] == "0" else self._ESC)
                i += 2
            else:
                out.append(ch)
                i += 1
        return "".join(out)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


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


class TenantRow(Base):
    """A customer of the gateway."""

    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Tenant id used in keys, policies and records."""
    name: Mapped[str] = mapped_column(String(256))
    """Display name."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When created (UTC)."""


class ApiKeyRow(Base):
    """An API key; only the SHA-256 of the secret is stored."""

    __tablename__ = "api_keys"
    __table_args__ = (Index("ix_api_keys_tenant_id", "tenant_id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Public key id (``key_...``)."""
    tenant_id: Mapped[str | None] = mapped_column(String(64), ForeignKey("tenants.id"))
    """Owning tenant; null for auditor keys that span tenants."""
    role: Mapped[str] = mapped_column(String(16))
    """tenant | auditor, or an operator key's role (admin, policy-author, rollout-operator)."""
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """Hex SHA-256 of the plaintext secret."""
    prefix: Mapped[str] = mapped_column(String(16))
    """First characters of the secret, for display."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When issued (UTC)."""
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    """When revoked; null while valid."""
    principal: Mapped[str | None] = mapped_column(String(64))
    """The named operator (``principals.name``) an operator key belongs to; null for tenant
    and tenant-auditor keys (revision 0003)."""
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    """When the key stops working (401); null: never. Rotation sets it to the grace end."""
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    """Last successful authentication, to the minute (written at most once a minute)."""


class AcceptanceStatsRow(Base):
    """Live acceptance history per tenant x proposer x draft version ('*' tenant = global)."""

    __tablename__ = "acceptance_stats"

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Tenant id, or ``*`` for the global history."""
    proposer: Mapped[str] = mapped_column(String(16), primary_key=True)
    """draft | prompt_lookup | prediction | suffix."""
    draft_version: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Draft version ('' for proposers without one)."""
    ewma_acceptance: Mapped[float] = mapped_column(Float)
    """EWMA of each request's per-token acceptance, accepted / (accepted + verify steps that
    rejected a drafted token); accepted / drafted before 2026-12-06 (policies/README.md)."""
    ewma_c: Mapped[float] = mapped_column(Float)
    """EWMA of draft-step cost / target-step cost."""
    samples: Mapped[int] = mapped_column(Integer)
    """Requests folded into the averages."""
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """Last update (UTC)."""


class ModelVersionRow(Base):
    """A registered model version (target or draft)."""

    __tablename__ = "model_versions"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    """Model name."""
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Version label."""
    role: Mapped[str] = mapped_column(String(16))
    """target | draft."""
    target: Mapped[str | None] = mapped_column(String(128))
    """For drafts: the target model it drafts for."""
    path: Mapped[str] = mapped_column(String(1024))
    """Local directory of the weights."""
    sha256: Mapped[str] = mapped_column(String(64))
    """Digest of the weights."""
    status: Mapped[str] = mapped_column(String(32))
    """registered | active | retired (registry's vocabulary)."""
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When registered (UTC)."""


class RolloutRow(Base):
    """A draft version moving canary -> full, or rolled back."""

    __tablename__ = "rollouts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    """Rollout id."""
    target: Mapped[str] = mapped_column(String(128))
    """Target model name."""
    draft: Mapped[str] = mapped_column(String(128))
    """Draft model name."""
    version: Mapped[str] = mapped_column(String(64))
    """Draft version being rolled out."""
    baseline_version: Mapped[str | None] = mapped_column(String(64))
    """Draft version serving the rest of the traffic."""
    canary_percent: Mapped[float] = mapped_column(Float)
    """Share of traffic on the new version (0-100)."""
    sticky: Mapped[bool] = mapped_column(Boolean)
    """Whether a tenant stays on the arm it first drew."""
    state: Mapped[str] = mapped_column(String(32))
    """canary | promoted | paused | rolled_back (registry's vocabulary)."""
    guard: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Guard thresholds (JSON)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When started (UTC)."""
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """Last state change (UTC)."""
    reason: Mapped[str | None] = mapped_column(Text)
    """Why the last change happened."""


class PolicyDocumentRow(Base):
    """A versioned policy document per tenant ('*' = default); newest version is active."""

    __tablename__ = "policy_documents"

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Tenant id, or ``*`` for the default bundle."""
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    """1, 2, 3 ... per tenant."""
    revision: Mapped[str] = mapped_column(String(64))
    """Content hash of the document."""
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    """The policy document (JSON)."""
    activated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When activated (UTC)."""


def _table(model: type[Base]) -> Table:
    return cast(Table, model.__table__)


RECORDS = _table(AuditRecordRow)
ADMISSIONS = _table(AuditAdmissionRow)
PAYLOADS = _table(AuditPayloadRow)
EVENTS = _table(AdminEventRow)
TENANTS = _table(TenantRow)
KEYS = _table(ApiKeyRow)
ACCEPTANCE = _table(AcceptanceStatsRow)
MODELS = _table(ModelVersionRow)
ROLLOUTS = _table(RolloutRow)
POLICIES = _table(PolicyDocumentRow)
