"""Tables of revision 0006 (the verifiable log): the Merkle tree over the three chains, its
signed checkpoints, their witnesses' cosignatures and the log's signing keys.

- ``audit_log_leaves``: leaf ``idx`` of the log is row ``source_id`` of chain ``kind``
  (``admission``, ``record``, ``event``), with its leaf hash (leaves.py): node ``(0, idx)``.
- ``audit_log_nodes``: the hash of every perfect subtree above the leaves (merkle.py, level
  1 and up); written once when its last leaf is sequenced, never changed.
- ``audit_checkpoints``: each signed checkpoint, as the note that was signed.
- ``audit_cosignatures``: a witness's cosignature line over a checkpoint.
- ``audit_signing_keys``: every key that ever signed checkpoints (verifier key form), so
  checkpoints signed before a rotation stay verifiable.

All five are append-only (the migration's triggers refuse UPDATE, DELETE, TRUNCATE).
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import BigInteger, Index, LargeBinary, SmallInteger, String, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.database.columns import Base, BigId, UTCDateTime


class LogLeafRow(Base):
    """One leaf of the log: which chain row it is."""

    __tablename__ = "audit_log_leaves"
    __table_args__ = (
        Index("ix_audit_log_leaves_kind_source_id", "kind", "source_id", unique=True),
    )

    idx: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    """Position in the log, from 0, gapless (SQLite: the rowid, one B-tree fewer)."""
    kind: Mapped[str] = mapped_column(String(16))
    """admission | record | event: the chain (audit_admissions, audit_records,
    admin_events)."""
    source_id: Mapped[int] = mapped_column(BigInteger)
    """The row's id in its chain's table."""
    hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    """RFC 9162 leaf hash (32 bytes): node (0, idx) of the tree."""


class LogNodeRow(Base):
    """The hash of one perfect subtree of the log."""

    __tablename__ = "audit_log_nodes"
    __table_args__ = ({"sqlite_with_rowid": False},)  # SQLite: stored in its key's B-tree

    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    """Height: k >= 1 for the subtree over 2**k leaves (leaf hashes are in the leaves)."""
    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    """Its position among the subtrees of its level (leaves idx*2**level onwards)."""
    hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    """RFC 9162 hash (32 bytes)."""


class CheckpointRow(Base):
    """A signed checkpoint of the log."""

    __tablename__ = "audit_checkpoints"
    __table_args__ = (
        Index("ix_audit_checkpoints_tree_size", "tree_size", unique=True),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    """Signing order."""
    tree_size: Mapped[int] = mapped_column(BigInteger)
    """Leaves covered; one checkpoint per size."""
    root_hash: Mapped[str] = mapped_column(String(64))
    """Root over those leaves (hex)."""
    key_id: Mapped[str] = mapped_column(String(8))
    """Id of the key that signed it (hex, as in its signature line)."""
    note: Mapped[str] = mapped_column(Text)
    """The signed note exactly as signed (C2SP tlog-checkpoint)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When signed (UTC)."""


class CosignatureRow(Base):
    """A witness's cosignature of a checkpoint."""

    __tablename__ = "audit_cosignatures"
    __table_args__ = (
        Index("ix_audit_cosignatures_checkpoint_id", "checkpoint_id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    """Arrival order."""
    checkpoint_id: Mapped[int] = mapped_column(BigInteger)
    """The checkpoint (``audit_checkpoints.id``)."""
    witness: Mapped[str] = mapped_column(String(128))
    """The witness's key name."""
    line: Mapped[str] = mapped_column(Text)
    """Its signature line (append it to the note to get the cosigned checkpoint)."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """When received (UTC)."""


class SigningKeyRow(Base):
    """A key that signs (or signed) the log's checkpoints."""

    __tablename__ = "audit_signing_keys"

    vkey: Mapped[str] = mapped_column(String(256), primary_key=True)
    """Verifier key: ``<name>+<key id hex>+<base64 key>``."""
    key_id: Mapped[str] = mapped_column(String(8))
    """Key id (hex)."""
    added_at: Mapped[datetime] = mapped_column(UTCDateTime())
    """First used (UTC); the newest is the one in force."""


LEAVES = cast(Table, LogLeafRow.__table__)
NODES = cast(Table, LogNodeRow.__table__)
CHECKPOINTS = cast(Table, CheckpointRow.__table__)
COSIGNATURES = cast(Table, CosignatureRow.__table__)
SIGNING_KEYS = cast(Table, SigningKeyRow.__table__)
LOG_TABLES = ("audit_log_leaves", "audit_log_nodes", "audit_checkpoints", "audit_cosignatures",
              "audit_signing_keys")  # fmt: skip
