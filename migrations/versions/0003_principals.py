"""Named operators and pooled rollout samples: ``principals`` (a name and a role), operator
keys as ``api_keys`` rows naming their principal, key expiry and last use, and
``rollout_samples`` (one row per request a rollout arm served, on any replica).

Revision ID: 0003_principals
Revises: 0002
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_principals"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UTC_DATETIME = sa.DateTime(timezone=True)
KEY_COLUMNS = ("principal", "expires_at", "last_used_at")


def upgrade() -> None:
    op.create_table(
        "principals",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("disabled_at", UTC_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_principals")),
    )
    op.add_column("api_keys", sa.Column("principal", sa.String(64), nullable=True))
    op.add_column("api_keys", sa.Column("expires_at", UTC_DATETIME, nullable=True))
    op.add_column("api_keys", sa.Column("last_used_at", UTC_DATETIME, nullable=True))
    op.create_table(
        "rollout_samples",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("rollout_id", sa.BigInteger(), nullable=False),
        sa.Column("arm", sa.String(16), nullable=False),
        sa.Column("drafted", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("decode_seconds", sa.Float(), nullable=False),
        sa.Column("replica", sa.String(64), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_samples")),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_rollout_samples_rollout_id_arm_id", "rollout_samples", ["rollout_id", "arm", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_rollout_samples_rollout_id_arm_id", table_name="rollout_samples")
    op.drop_table("rollout_samples")
    for column in KEY_COLUMNS:
        op.execute(f"ALTER TABLE api_keys DROP COLUMN {column}")
    op.drop_table("principals")
