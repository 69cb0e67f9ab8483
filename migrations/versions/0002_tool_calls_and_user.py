"""audit_records: the end user's digest (user_sha256, indexed) and the tool calls a response
made (tool_calls, tool_names). Nullable, and hashed into the chain only when set, so the
records written before this revision verify as before.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("audit_records", sa.Column("user_sha256", sa.String(64), nullable=True))
    op.add_column("audit_records", sa.Column("tool_calls", sa.Integer(), nullable=True))
    op.add_column("audit_records", sa.Column("tool_names", sa.JSON(), nullable=True))
    op.create_index("ix_audit_records_user_sha256", "audit_records", ["user_sha256"])


def downgrade() -> None:
    op.drop_index("ix_audit_records_user_sha256", table_name="audit_records")
    # plain ALTER TABLE (SQLite >= 3.35 has DROP COLUMN): a batch copy would drop the
    # append-only triggers with the old table
    for column in ("tool_names", "tool_calls", "user_sha256"):
        op.execute(f"ALTER TABLE audit_records DROP COLUMN {column}")
