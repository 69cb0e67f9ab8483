"""The verifiable log: audit_log_leaves (which chain row each leaf is, and its hash),
audit_log_nodes (the Merkle tree's perfect subtrees above the leaves), audit_checkpoints
(signed tree heads), audit_cosignatures (witnesses') and audit_signing_keys. All
append-only, like the chains.

Revision ID: 0006_audit_log
Revises: 0005_admission_records
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_audit_log"
down_revision: str | None = "0005_admission_records"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UTC_DATETIME = sa.DateTime(timezone=True)
TABLES = (
    "audit_log_leaves", "audit_log_nodes", "audit_checkpoints", "audit_cosignatures",
    "audit_signing_keys",
)  # fmt: skip


def _create_guards(table: str) -> None:
    """Refuse UPDATE, DELETE and TRUNCATE, as revision 0001 does for the chains."""
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION audit_append_only()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_append_only()"
        )
    elif dialect == "sqlite":
        for verb in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{verb} on {table} refused: append-only'); END"
            )


def upgrade() -> None:
    op.create_table(
        "audit_log_leaves",
        sa.Column("idx", BIG_ID, autoincrement=False, nullable=False),  # SQLite: the rowid
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("source_id", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
        sa.PrimaryKeyConstraint("idx", name=op.f("pk_audit_log_leaves")),
    )
    op.create_index(
        "ix_audit_log_leaves_kind_source_id", "audit_log_leaves", ["kind", "source_id"],
        unique=True,
    )  # fmt: skip
    op.create_table(
        "audit_log_nodes",
        sa.Column("level", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("idx", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
        sa.PrimaryKeyConstraint("level", "idx", name=op.f("pk_audit_log_nodes")),
        sqlite_with_rowid=False,  # one B-tree: the (level, idx) key holds the hash
    )
    op.create_table(
        "audit_checkpoints",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("tree_size", sa.BigInteger(), nullable=False),
        sa.Column("root_hash", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(8), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_checkpoints")),
        sqlite_autoincrement=True,
    )
    op.create_index(
        "ix_audit_checkpoints_tree_size", "audit_checkpoints", ["tree_size"], unique=True
    )
    op.create_table(
        "audit_cosignatures",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("checkpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("witness", sa.String(128), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_cosignatures")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_cosignatures_checkpoint_id", "audit_cosignatures", ["checkpoint_id"])
    op.create_table(
        "audit_signing_keys",
        sa.Column("vkey", sa.String(256), nullable=False),
        sa.Column("key_id", sa.String(8), nullable=False),
        sa.Column("added_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("vkey", name=op.f("pk_audit_signing_keys")),
    )
    for table in TABLES:
        _create_guards(table)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for table in TABLES:
            for verb in ("update", "delete"):
                op.execute(f"DROP TRIGGER IF EXISTS {table}_no_{verb}")
    for table in reversed(TABLES):
        op.drop_table(table)  # PostgreSQL drops the table's triggers with it
