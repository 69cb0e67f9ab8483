"""audit_records: the request's OpenTelemetry trace id (trace_id, indexed), so an auditor can
go from a record to its trace and back. Nullable (tracing is off by default), and hashed
into the chain only when set, so the records written before this revision verify as before.

Revision ID: 0004_trace_id
Revises: 0003_principals
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_trace_id"
down_revision: str | None = "0003_principals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("audit_records", sa.Column("trace_id", sa.String(32), nullable=True))
    op.create_index("ix_audit_records_trace_id", "audit_records", ["trace_id"])


def downgrade() -> None:
    op.drop_index("ix_audit_records_trace_id", table_name="audit_records")
    # plain ALTER TABLE (see 0002): a batch copy would drop the append-only triggers
    op.execute("ALTER TABLE audit_records DROP COLUMN trace_id")
