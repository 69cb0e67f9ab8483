"""audit_admissions: a request's admission record, written and durable before its first
output byte (record first, act second), on a hash chain of its own and append-only like
audit_records; audit_records.admission_id (indexed) names the admission a final record
completes. Nullable and hashed into the chain only when set, so the records written before
this revision verify as before.

Revision ID: 0005_admission_records
Revises: 0004_trace_id
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_admission_records"
down_revision: str | None = "0004_trace_id"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UTC_DATETIME = sa.DateTime(timezone=True)
TABLE = "audit_admissions"


def _create_guards() -> None:
    """Refuse UPDATE, DELETE and TRUNCATE, as revision 0001 does for the other chains
    (PostgreSQL reuses its audit_append_only() function)."""
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(
            f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
            "FOR EACH ROW EXECUTE FUNCTION audit_append_only()"
        )
        op.execute(
            f"CREATE TRIGGER {TABLE}_no_truncate BEFORE TRUNCATE ON {TABLE} "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only()"
        )
    elif dialect == "sqlite":
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {TABLE}_no_{verb.lower()} BEFORE {verb} ON {TABLE} "
                f"BEGIN SELECT RAISE(ABORT, '{verb} on {TABLE} refused: append-only'); END"
            )


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=True),
        sa.Column("endpoint", sa.String(128), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("decision_id", sa.String(64), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("proposer", sa.String(16), nullable=True),
        sa.Column("reason_codes", sa.JSON(), nullable=False),
        sa.Column("policy_revision", sa.String(64), nullable=True),
        sa.Column("target_model", sa.String(128), nullable=False),
        sa.Column("target_version", sa.String(64), nullable=False),
        sa.Column("target_sha256", sa.String(64), nullable=True),
        sa.Column("draft_model", sa.String(128), nullable=True),
        sa.Column("draft_version", sa.String(64), nullable=True),
        sa.Column("draft_sha256", sa.String(64), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("prompt_sha256", sa.String(64), nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=True),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("record_hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_admissions")),
        sa.UniqueConstraint("record_hash", name=op.f("uq_audit_admissions_record_hash")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_admissions_request_id", TABLE, ["request_id"])
    op.create_index("ix_audit_admissions_tenant_id_id", TABLE, ["tenant_id", "id"])
    op.create_index("ix_audit_admissions_created_at", TABLE, ["created_at"])
    _create_guards()
    op.add_column("audit_records", sa.Column("admission_id", sa.BigInteger(), nullable=True))
    op.create_index("ix_audit_records_admission_id", "audit_records", ["admission_id"])


def downgrade() -> None:
    op.drop_index("ix_audit_records_admission_id", table_name="audit_records")
    # plain ALTER TABLE (see 0002): a batch copy would drop the append-only triggers
    op.execute("ALTER TABLE audit_records DROP COLUMN admission_id")
    if op.get_bind().dialect.name == "sqlite":
        for verb in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_{verb}")
    op.drop_table(TABLE)  # PostgreSQL drops the table's triggers with it
