"""Audit tables: append-only hash-chained audit_records and admin_events (with PostgreSQL
and SQLite triggers refusing UPDATE/DELETE/TRUNCATE), purgeable audit_payloads, and the
operational tables (tenants, api_keys, acceptance_stats, model_versions, rollouts,
policy_documents).

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UTC_DATETIME = sa.DateTime(timezone=True)
APPEND_ONLY = ("audit_records", "admin_events")

PG_FUNCTION = """
CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on % refused: audit tables are append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def _create_guards() -> None:
    """Refuse UPDATE, DELETE and TRUNCATE on the chained tables."""
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(PG_FUNCTION)
        for table in APPEND_ONLY:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION audit_append_only()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only()"
            )
    elif dialect == "sqlite":  # SQLite has no TRUNCATE; DELETE without WHERE is caught here
        for table in APPEND_ONLY:
            for verb in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{verb} on {table} refused: append-only'); END"
                )


def _drop_guards() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        for table in APPEND_ONLY:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
        op.execute("DROP FUNCTION IF EXISTS audit_append_only()")
    elif dialect == "sqlite":
        for table in APPEND_ONLY:
            for verb in ("update", "delete"):
                op.execute(f"DROP TRIGGER IF EXISTS {table}_no_{verb}")


revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "acceptance_stats",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("proposer", sa.String(length=16), nullable=False),
        sa.Column("draft_version", sa.String(length=64), nullable=False),
        sa.Column("ewma_acceptance", sa.Float(), nullable=False),
        sa.Column("ewma_c", sa.Float(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id", "proposer", "draft_version", name=op.f("pk_acceptance_stats")
        ),
    )
    op.create_table(
        "admin_events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=256), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("record_hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_events")),
        sa.UniqueConstraint("record_hash", name=op.f("uq_admin_events_record_hash")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_admin_events_created_at", "admin_events", ["created_at"])

    op.create_table(
        "audit_records",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("decision_id", sa.String(length=64), nullable=True),
        sa.Column("tenant_id", sa.String(length=64), nullable=True),
        sa.Column("key_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("endpoint", sa.String(length=128), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("error_type", sa.String(length=64), nullable=True),
        sa.Column("requested_mode", sa.String(length=16), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=True),
        sa.Column("reason_codes", sa.JSON(), nullable=False),
        sa.Column("policy_revision", sa.String(length=64), nullable=True),
        sa.Column("target_model", sa.String(length=128), nullable=True),
        sa.Column("target_version", sa.String(length=64), nullable=True),
        sa.Column("target_sha256", sa.String(length=64), nullable=True),
        sa.Column("proposer", sa.String(length=16), nullable=True),
        sa.Column("draft_model", sa.String(length=128), nullable=True),
        sa.Column("draft_version", sa.String(length=64), nullable=True),
        sa.Column("draft_sha256", sa.String(length=64), nullable=True),
        sa.Column("k_min", sa.Integer(), nullable=True),
        sa.Column("k_max", sa.Integer(), nullable=True),
        sa.Column("drafted_tokens", sa.Integer(), nullable=False),
        sa.Column("accepted_tokens", sa.Integer(), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=True),
        sa.Column("top_p", sa.Float(), nullable=True),
        sa.Column("top_k", sa.Integer(), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("constraint", sa.String(length=16), nullable=True),
        sa.Column("constraint_sha256", sa.String(length=64), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("prompt_sha256", sa.String(length=64), nullable=True),
        sa.Column("completion_sha256", sa.String(length=64), nullable=True),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("record_hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_records")),
        sa.UniqueConstraint("record_hash", name=op.f("uq_audit_records_record_hash")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_records_created_at", "audit_records", ["created_at"])
    op.create_index("ix_audit_records_decision_id", "audit_records", ["decision_id"])
    op.create_index("ix_audit_records_request_id", "audit_records", ["request_id"])
    op.create_index("ix_audit_records_tenant_id_id", "audit_records", ["tenant_id", "id"])

    op.create_table(
        "model_versions",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=128), nullable=True),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("registered_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("name", "version", name=op.f("pk_model_versions")),
    )
    op.create_table(
        "policy_documents",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("revision", sa.String(length=64), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("activated_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "version", name=op.f("pk_policy_documents")),
    )
    op.create_table(
        "rollouts",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("target", sa.String(length=128), nullable=False),
        sa.Column("draft", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("baseline_version", sa.String(length=64), nullable=True),
        sa.Column("canary_percent", sa.Float(), nullable=False),
        sa.Column("sticky", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("guard", sa.JSON(), nullable=True),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("updated_at", UTC_DATETIME, nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollouts")),
    )
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("revoked_at", UTC_DATETIME, nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index("ix_api_keys_tenant_id", "api_keys", ["tenant_id"])

    op.create_table(
        "audit_payloads",
        sa.Column("record_id", BIG_ID, autoincrement=False, nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.Column("retention_days", sa.Integer(), nullable=False),
        sa.Column("expires_at", UTC_DATETIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["record_id"],
            ["audit_records.id"],
            name=op.f("fk_audit_payloads_record_id_audit_records"),
        ),
        sa.PrimaryKeyConstraint("record_id", name=op.f("pk_audit_payloads")),
    )
    op.create_index("ix_audit_payloads_expires_at", "audit_payloads", ["expires_at"])
    _create_guards()


def downgrade() -> None:
    _drop_guards()
    op.drop_index("ix_audit_payloads_expires_at", table_name="audit_payloads")

    op.drop_table("audit_payloads")
    op.drop_index("ix_api_keys_tenant_id", table_name="api_keys")

    op.drop_table("api_keys")
    op.drop_table("tenants")
    op.drop_table("rollouts")
    op.drop_table("policy_documents")
    op.drop_table("model_versions")
    op.drop_index("ix_audit_records_tenant_id_id", table_name="audit_records")
    op.drop_index("ix_audit_records_request_id", table_name="audit_records")
    op.drop_index("ix_audit_records_decision_id", table_name="audit_records")
    op.drop_index("ix_audit_records_created_at", table_name="audit_records")

    op.drop_table("audit_records")
    op.drop_index("ix_admin_events_created_at", table_name="admin_events")

    op.drop_table("admin_events")
    op.drop_table("acceptance_stats")
