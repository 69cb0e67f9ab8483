"""Tables of revision 0003 (shared by every replica): named operators and the rollout
arms' request samples.

- ``principals``: a named operator (a person or a pipeline) with one role; its keys are
  ``api_keys`` rows whose ``principal`` names it. Admin events record the name as actor.
- ``rollout_samples``: one row per request a rollout arm served, on any replica, so that
  the guard and ``rollouts list`` judge the pooled traffic, not one replica's share.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import BigInteger, Float, Index, Integer, String, Table
from sqlalchemy.orm import Mapped, mapped_column

from gateway.database.columns import Base, BigId, UTCDateTime


class PrincipalRow(Base):
    """A named operator; the bootstrap key (GATEWAY_ADMIN_KEY) acts as ``admin``."""

    __tablename__ = "principals"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Unique name (``alice``, ``ci-rollouts``); the actor of the admin events it causes."""
    role: Mapped[str] = mapped_column(String(32))
    """admin | policy-author | rollout-operator | auditor (see gateway.serving.auth)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When created (UTC)."""
    created_by: Mapped[str] = mapped_column(String(128))
    """The principal that created it."""
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    """When disabled (every key revoked with it); null while active."""


class RolloutSampleRow(Base):
    """One request served by a rollout arm (counts only, like the audit record)."""

    __tablename__ = "rollout_samples"
    __table_args__ = (
        Index("ix_rollout_samples_rollout_id_arm_id", "rollout_id", "arm", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    """Arrival order across replicas (the guard's window takes the newest ids)."""
    rollout_id: Mapped[int] = mapped_column(BigInteger)
    """The rollout (``rollouts.id``)."""
    arm: Mapped[str] = mapped_column(String(16))
    """canary | baseline."""
    drafted: Mapped[int] = mapped_column(Integer)
    """Draft tokens proposed."""
    accepted: Mapped[int] = mapped_column(Integer)
    """Draft tokens kept."""
    tokens: Mapped[int] = mapped_column(Integer)
    """Completion tokens emitted."""
    decode_seconds: Mapped[float] = mapped_column(Float)
    """Decode time of the request (draft + verify + other)."""
    replica: Mapped[str] = mapped_column(String(64))
    """Which replica served it (host name and process id)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When recorded (UTC)."""


PRINCIPALS = cast(Table, PrincipalRow.__table__)
SAMPLES = cast(Table, RolloutSampleRow.__table__)
