"""ORM tables of the gateway: the one metadata Alembic migrates (``migrations/env.py``).

Append-only, hash-chained: ``audit_records``, ``audit_admissions`` and ``admin_events``
(PostgreSQL and SQLite triggers refuse UPDATE/DELETE/TRUNCATE). Purgeable:
``audit_payloads``. Those four: tables_audit.py. Plain mutable CRUD, here: ``tenants``,
``api_keys``, ``acceptance_stats``, ``model_versions``, ``rollouts``,
``policy_documents``. All timestamps are stored in UTC and read back timezone-aware
(columns.py, with the metadata `Base`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.database import tables_audit  # noqa: F401 (the metadata holds the audit tables)
from gateway.database.columns import Base, BigId, UTCDateTime, table_of

__all__ = ["Base"]


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


TENANTS = table_of(TenantRow)
KEYS = table_of(ApiKeyRow)
ACCEPTANCE = table_of(AcceptanceStatsRow)
MODELS = table_of(ModelVersionRow)
ROLLOUTS = table_of(RolloutRow)
POLICIES = table_of(PolicyDocumentRow)
