"""audit_records: reasoning_tokens, the thinking tokens of a thinking model's answer (its
<think>...</think>, tags included). Nullable (null: the model does not think) and hashed into
the chain only when set, so the records written before this revision verify as before.

Revision ID: 0007_reasoning_tokens
Revises: 0006_audit_log
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_reasoning_tokens"
down_revision: str | None = "0006_audit_log"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("audit_records", sa.Column("reasoning_tokens", sa.Integer, nullable=True))


def downgrade() -> None:
    # plain ALTER TABLE (see 0002): a batch copy would drop the append-only triggers
    op.execute("ALTER TABLE audit_records DROP COLUMN reasoning_tokens")
