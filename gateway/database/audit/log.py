"""The verifiable log over the audit chains: sequencing, signed checkpoints and proofs.

One log per database, whichever replica writes: :meth:`AuditLog.checkpoint` runs in one
write transaction under the log's lock (PostgreSQL: an advisory lock; SQLite: the database's
write lock) and

1. registers the signing key if it is new (a rotation is an admin event,
   ``audit.signing_key_rotated``, in the same transaction and so in this checkpoint);
2. *sequences*: the rows the three chains gained since the last run become the next leaves
   (admissions, then records, then events, each in id order); a leaf commits to its row's
   ``record_hash`` (leaves.py), so this reads three columns a row and encodes nothing; each
   row must link to the one before it (a chain cut or relinked since stops the log: nothing
   is signed over it);
3. stores every perfect subtree the new leaves complete (merkle.py);
4. proves the new tree consistent with the last signed checkpoint (from the stored nodes,
   checked against the last checkpoint's signed root) and only then signs a checkpoint
   (note.py) and stores it.

Appends themselves are unchanged: the log costs the request path nothing; a record is in a
signed checkpoint at most one checkpoint interval after it is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from gateway.database.audit import merkle
from gateway.database.audit.log_sign import (
    SEQUENCE_BATCH,
    LogBroken,
    Signed,
    register_key,
    sign_checkpoint,
)
from gateway.database.audit.log_tables import CHECKPOINTS, COSIGNATURES, LEAVES, SIGNING_KEYS
from gateway.database.audit.log_tree import KIND_TABLES, log_size, node_source
from gateway.database.audit.note import SignedNote, Signer, b64
from gateway.database.audit.queries import to_json_ready
from gateway.database.audit.types import AuditUnavailable
from gateway.database.base import utcnow
from gateway.database.store import Database

__all__ = ["AuditLog", "LogBroken", "Signed"]

LOG_LOCK = 0x61756469745F6C  # "audit_l": one sequencer and signer at a time


def _checkpoint_row(conn: Connection, tree_size: int | None) -> Any:
    stmt = select(CHECKPOINTS)
    if tree_size is None:
        stmt = stmt.order_by(CHECKPOINTS.c.id.desc()).limit(1)
    else:
        stmt = stmt.where(CHECKPOINTS.c.tree_size == tree_size)
    return conn.execute(stmt).first()


def _inclusion(
    conn: Connection, kind: str, source_id: int, tree_size: int | None
) -> dict[str, Any]:
    cp = _checkpoint_row(conn, tree_size)
    if cp is None:
        raise LookupError("no signed checkpoint" + (f" of size {tree_size}" if tree_size else ""))
    where = (LEAVES.c.kind == kind, LEAVES.c.source_id == source_id)
    leaf = conn.execute(select(LEAVES.c.idx).where(*where)).scalar()
    if leaf is None or leaf >= cp.tree_size:
        raise LookupError(f"{kind} {source_id} is not in the log at size {cp.tree_size} yet")
    index, size, source = int(leaf), int(cp.tree_size), node_source(conn)
    got: dict[merkle.Node, bytes] = {}

    def with_leaf(wanted: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
        got.update(source([*wanted, (0, index)]))  # the leaf's own hash in the same query
        return got

    hashes = merkle.inclusion_proof(index, size, with_leaf)
    leaf_hash = got[(0, index)] if got else source([(0, index)])[(0, index)]
    return {
        "kind": kind, "source_id": source_id, "leaf_index": index,
        "leaf_hash": b64(leaf_hash), "tree_size": size,
        "hashes": [b64(h) for h in hashes], "checkpoint": cp.note,
    }  # fmt: skip


class AuditLog:
    """The log of one database; ``signer`` (the log's key, its name the origin) is needed
    to sign checkpoints only: reading proofs and checkpoints takes none."""

    def __init__(self, store: Database, signer: Signer | None = None) -> None:
        self.store = store
        self.signer = signer

    # -- signing -----------------------------------------------------------------------

    async def checkpoint(
        self, now: datetime | None = None, *, limit: int = SEQUENCE_BATCH
    ) -> Signed | None:
        """Sequence what the chains gained and sign a checkpoint over it; None when there
        was nothing new. LogBroken when a row or the tree no longer matches, AuditUnavailable
        when the database refuses."""
        signer = self.signer
        if signer is None:
            raise ValueError("this log has no signing key")
        stamp = (now or utcnow()).replace(microsecond=0)
        postgres = not self.store.is_sqlite

        def body(conn: Connection) -> Signed | None:
            register_key(conn, signer, stamp, postgres)
            return sign_checkpoint(conn, signer, stamp, limit)

        try:  # one hand-off to the store's writer (SQLite: its own thread), under LOG_LOCK
            return await self.store._transact(body, LOG_LOCK)
        except SQLAlchemyError as exc:
            raise AuditUnavailable(f"checkpoint failed: {exc}") from exc

    async def add_cosignature(self, checkpoint_id: int, witness: str, line: str) -> None:
        async with self.store._write() as conn:
            await conn.execute(
                insert(COSIGNATURES),
                {"checkpoint_id": checkpoint_id, "witness": witness, "line": line,
                 "created_at": utcnow()},
            )  # fmt: skip

    # -- reading -----------------------------------------------------------------------

    async def size(self) -> int:
        async with self.store._read() as conn:
            return await conn.run_sync(log_size)

    async def pending(self) -> int:
        """About how many chain rows are not in the log yet (ids past the last sequenced;
        a rolled-back id counts too). Six index seeks in one statement, on the store's
        reader: the job asks every two seconds."""
        parts = [
            f"(SELECT coalesce(max(id), 0) FROM {t.name}) - (SELECT coalesce(max(source_id), 0) "
            f"FROM audit_log_leaves WHERE kind = '{kind}')"
            for kind, t in KIND_TABLES.items()
        ]
        sql = "SELECT " + ", ".join(parts)
        row = await self.store._query(lambda c: c.exec_driver_sql(sql).one())
        return sum(max(0, int(x)) for x in row)

    async def checkpoints(
        self, limit: int = 100, before: int | None = None
    ) -> list[dict[str, Any]]:
        """Checkpoints newest first (``before``: ids below it), each with its witnesses'
        cosignature lines and ``cosigned``, the note with them appended."""
        stmt = select(CHECKPOINTS).order_by(CHECKPOINTS.c.id.desc()).limit(max(1, limit))
        if before is not None:
            stmt = stmt.where(CHECKPOINTS.c.id < before)
        async with self.store._read() as conn:
            rows = [dict(r) for r in (await conn.execute(stmt)).mappings()]
            ids = [r["id"] for r in rows]
            cos = (
                await conn.execute(
                    select(COSIGNATURES).where(COSIGNATURES.c.checkpoint_id.in_(ids))
                    .order_by(COSIGNATURES.c.id)
                )
            ).mappings().all() if ids else []  # fmt: skip
        for row in rows:
            lines = [c for c in cos if c["checkpoint_id"] == row["id"]]
            row["witnesses"] = [{"witness": c["witness"], "line": c["line"]} for c in lines]
            row["cosigned"] = row["note"] + "".join(c["line"] for c in lines)
        return [to_json_ready(r) for r in rows]

    async def latest(self) -> dict[str, Any] | None:
        rows = await self.checkpoints(1)
        return rows[0] if rows else None

    async def keys(self) -> list[dict[str, Any]]:
        """Every signing key, oldest first (verifier key form)."""
        stmt = select(SIGNING_KEYS).order_by(SIGNING_KEYS.c.added_at)
        async with self.store._read() as conn:
            return [to_json_ready(r) for r in (await conn.execute(stmt)).mappings()]

    async def _checkpoint_for(self, conn: Any, tree_size: int | None) -> Any:
        stmt = select(CHECKPOINTS)
        if tree_size is None:
            stmt = stmt.order_by(CHECKPOINTS.c.id.desc()).limit(1)
        else:
            stmt = stmt.where(CHECKPOINTS.c.tree_size == tree_size)
        return (await conn.execute(stmt)).first()

    async def inclusion(
        self, kind: str, source_id: int, tree_size: int | None = None
    ) -> dict[str, Any]:
        """Inclusion proof of chain row ``(kind, source_id)`` against the signed checkpoint
        of ``tree_size`` (default the latest). LookupError: no such leaf or checkpoint, or
        the row is not covered by it yet. Four indexed queries in one hand-off to the
        store's reader (SQLite: its own thread): the checkpoint, the leaf's index, the
        leaf hashes and the nodes the proof needs."""
        return await self.store._query(lambda c: _inclusion(c, kind, source_id, tree_size))

    async def consistency(self, first: int, second: int | None = None) -> dict[str, Any]:
        """Consistency proof between the signed checkpoints of sizes ``first`` and
        ``second`` (default the latest). LookupError when either was never signed."""
        async with self.store._read() as conn:
            old = await self._checkpoint_for(conn, first)
            new = await self._checkpoint_for(conn, second)
            if old is None or new is None:
                raise LookupError("no signed checkpoint of that size")
            if old.tree_size > new.tree_size:
                raise LookupError("first must not be larger than second")
            sizes = int(old.tree_size), int(new.tree_size)
            hashes = await conn.run_sync(lambda c: merkle.consistency_proof(*sizes, node_source(c)))
        return {
            "first": int(old.tree_size), "second": int(new.tree_size),
            "hashes": [b64(h) for h in hashes],
            "first_checkpoint": old.note, "second_checkpoint": new.note,
        }  # fmt: skip

    async def proof_between(self, first: int, second: int) -> list[bytes]:
        """Consistency proof between any two sizes of the stored tree (a witness asks from
        the size it holds, which may be no checkpoint this database kept)."""
        async with self.store._read() as conn:
            return await conn.run_sync(
                lambda c: merkle.consistency_proof(first, second, node_source(c))
            )

    async def cosigned_notes(self) -> str:
        """Every checkpoint, oldest first, with its cosignatures: a checkpoints file."""
        out, before = [], None
        while True:
            page = await self.checkpoints(1000, before)
            out.extend(page)
            if len(page) < 1000:
                break
            before = page[-1]["id"]
        return "\n".join(str(SignedNote.parse(r["cosigned"])) for r in reversed(out))
