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

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from gateway.database.audit import merkle
from gateway.database.audit.chain import EVENT_FIELDS, GENESIS, link
from gateway.database.audit.leaves import leaf_from_hash
from gateway.database.audit.log_tables import (
    CHECKPOINTS,
    COSIGNATURES,
    LEAVES,
    SIGNING_KEYS,
)
from gateway.database.audit.note import Checkpoint, SignedNote, Signer, b64
from gateway.database.audit.queries import to_json_ready
from gateway.database.audit.types import AuditUnavailable
from gateway.database.base import EVENTS_LOCK, chain_head, utcnow
from gateway.database.store import Database
from gateway.database.tables_audit import ADMISSIONS, EVENTS, RECORDS

LOG_LOCK = 0x61756469745F6C  # "audit_l": one sequencer and signer at a time
KIND_TABLES = {"admission": ADMISSIONS, "record": RECORDS, "event": EVENTS}
SEQUENCE_BATCH = 5_000
"""Rows one checkpoint transaction sequences at most (the job runs again at once for the
rest): on SQLite the transaction holds the database's write lock, so a backlog (the first
start over an existing log) is taken in steps that delay appends by tens of milliseconds,
not by seconds."""
KEY_ACTOR = "gateway:checkpoints"
ROTATED = "audit.signing_key_rotated"
ADDED = "audit.signing_key_added"


class LogBroken(AuditUnavailable):
    """A chain row no longer matches its hash or link, or the stored tree no longer
    extends the last signed checkpoint: nothing is signed until an operator looks."""


@dataclasses.dataclass(frozen=True)
class Signed:
    """What one checkpoint run did."""

    id: int
    size: int
    root: bytes
    note: str
    appended: int
    """Leaves this run sequenced."""


def node_source(conn: Connection) -> merkle.NodeSource:
    """Perfect nodes read from the store: leaf hashes (level 0) from ``audit_log_leaves``,
    the others from ``audit_log_nodes``; at most two queries a proof."""

    def fetch(wanted: Sequence[merkle.Node]) -> dict[merkle.Node, bytes]:
        got: dict[merkle.Node, bytes] = {}
        by_level: dict[int, list[str]] = {}
        for level, idx in wanted:
            by_level.setdefault(int(level), []).append(str(int(idx)))
        # Plain SQL over integers this code computed (never input), one IN list per level
        # (each an index range of the primary key): building the same query as SQLAlchemy
        # expressions took most of a proof's time (~5 ms of ~6 at 1M leaves), and a
        # row-value IN over (level, idx) made SQLite scan the table.
        leaves = by_level.pop(0, None)
        if leaves:
            sql = f"SELECT idx, hash FROM audit_log_leaves WHERE idx IN ({','.join(leaves)})"
            got.update({(0, int(i)): bytes(h) for i, h in conn.execute(text(sql))})
        if by_level:
            where = " OR ".join(
                f"(level = {lv} AND idx IN ({','.join(ix)}))" for lv, ix in by_level.items()
            )
            sql = f"SELECT level, idx, hash FROM audit_log_nodes WHERE {where}"
            got.update({(int(lv), int(i)): bytes(h) for lv, i, h in conn.execute(text(sql))})
        missing = [n for n in wanted if n not in got]
        if missing:
            raise merkle.ProofError(f"tree nodes missing from the store: {missing[:3]}")
        return got

    return fetch


def log_size(conn: Connection) -> int:
    top = conn.execute(select(func.max(LEAVES.c.idx))).scalar()
    return 0 if top is None else int(top) + 1


def append_leaves(conn: Connection, size: int, leaves: list[tuple[str, int, bytes]]) -> int:
    """Store ``leaves`` (kind, source id, leaf hash) after the ``size`` already there, with
    every perfect node they complete; returns the new size."""
    if not leaves:
        return size
    frontier = node_source(conn)(merkle.frontier_nodes(size))
    nodes = merkle.new_nodes(size, [h for _, _, h in leaves], frontier)
    rows = [(size + i, k, s, h) for i, (k, s, h) in enumerate(leaves)]
    _insert_many(conn, "audit_log_leaves (idx, kind, source_id, hash)", rows)
    inner = [(lv, ix, h) for (lv, ix), h in nodes if lv]
    if inner:
        _insert_many(conn, "audit_log_nodes (level, idx, hash)", inner)
    return size + len(leaves)


def _insert_many(conn: Connection, into: str, rows: list[tuple[Any, ...]]) -> None:
    """``INSERT INTO <into> VALUES (...)`` for plain tuples, straight to the driver: the
    per-row parameter building of ``insert(table)`` was half a checkpoint's CPU."""
    marks = _placeholders(conn, len(rows[0]))
    conn.exec_driver_sql(f"INSERT INTO {into} VALUES ({marks})", rows)


def _placeholders(conn: Connection, n: int) -> str:
    style = conn.dialect.paramstyle
    if style == "qmark":
        return ", ".join("?" * n)
    if style.startswith("numeric"):  # asyncpg's adapter: $1, $2 ...
        return ", ".join(f"${i}" for i in range(1, n + 1))
    return ", ".join(["%s"] * n)


def _sequenced(conn: Connection) -> dict[str, int]:
    """The last row id of each chain that is in the log: one max per kind, each a seek in
    the (kind, source_id) index (a GROUP BY would read the whole index every run)."""
    out = {}
    for kind in KIND_TABLES:
        stmt = select(func.max(LEAVES.c.source_id)).where(LEAVES.c.kind == kind)
        out[kind] = int(conn.execute(stmt).scalar() or 0)
    return out


def _new_rows(conn: Connection, limit: int) -> list[tuple[str, int, bytes]]:
    """The chains' rows not yet in the log (at most ``limit``), checked and hashed."""
    last = _sequenced(conn)
    out: list[tuple[str, int, bytes]] = []
    for kind, table in KIND_TABLES.items():
        if len(out) >= limit:
            break
        after = int(last.get(kind) or 0)
        prev = GENESIS
        if after:
            prev = conn.execute(select(table.c.record_hash).where(table.c.id == after)).scalar_one()
        sql = (
            f"SELECT id, prev_hash, record_hash FROM {table.name} WHERE id > {after} "
            f"ORDER BY id LIMIT {int(limit - len(out))}"
        )  # integers this code computed; the driver's rows, without result processing
        for rid, prev_hash, record_hash in conn.exec_driver_sql(sql):
            if prev_hash != prev:
                raise LogBroken(
                    f"{table.name} row {rid} does not link to the row before it: the chain "
                    "was cut or rewritten; not sequenced, no checkpoint signed (run verify)"
                )
            prev = record_hash
            out.append((kind, int(rid), leaf_from_hash(kind, record_hash)))
    return out


def _latest(conn: Connection) -> Any:
    return conn.execute(select(CHECKPOINTS).order_by(CHECKPOINTS.c.id.desc()).limit(1)).first()


def _sign(conn: Connection, signer: Signer, now: datetime, limit: int) -> Signed | None:
    size = log_size(conn)
    leaves = _new_rows(conn, limit)
    new_size = append_leaves(conn, size, leaves)
    last = _latest(conn)
    old_size = 0 if last is None else int(last.tree_size)
    if new_size == old_size and last is not None:
        return None
    if new_size == 0:
        return None
    source = node_source(conn)
    root = merkle.root(new_size, source)
    if last is not None:
        old_root = bytes.fromhex(last.root_hash)
        try:
            proof = merkle.consistency_proof(old_size, new_size, source)
            merkle.verify_consistency(old_size, new_size, old_root, root, proof)
        except merkle.ProofError as exc:
            raise LogBroken(f"the stored tree does not extend checkpoint {last.id}: {exc}") from exc
    body = Checkpoint(signer.name, new_size, root, now).text
    note = body + "\n" + signer.sign_line(body)
    row = {
        "tree_size": new_size, "root_hash": root.hex(), "key_id": signer.verifier.id.hex(),
        "note": note, "created_at": now,
    }  # fmt: skip
    cid = conn.execute(insert(CHECKPOINTS).returning(CHECKPOINTS.c.id), row).scalar_one()
    return Signed(int(cid), new_size, root, note, len(leaves))


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


def _register_key(conn: Connection, signer: Signer, now: datetime, postgres: bool) -> None:
    """A key not seen before is registered, and chained as an admin event (a rotation when
    another key signed before) in the same transaction, so it is a leaf of the checkpoint
    it signs."""
    vkey = signer.verifier.vkey
    stmt = select(SIGNING_KEYS.c.vkey).order_by(SIGNING_KEYS.c.added_at.desc())
    known = [r[0] for r in conn.execute(stmt).all()]
    if vkey in known:
        return
    key_id = signer.verifier.id.hex()
    conn.execute(insert(SIGNING_KEYS), {"vkey": vkey, "key_id": key_id, "added_at": now})
    if postgres:  # the admin events' chain lock, as every event append takes it
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": EVENTS_LOCK})
    row: dict[str, Any] = {
        "actor": KEY_ACTOR, "action": ROTATED if known else ADDED,
        "subject": "audit_signing_keys", "before": {"vkey": known[0]} if known else None,
        "after": {"vkey": vkey, "key_id": key_id}, "created_at": now,
        "prev_hash": chain_head(conn, EVENTS.c.id, EVENTS.c.record_hash),
    }  # fmt: skip
    row["record_hash"] = link(row, EVENT_FIELDS, row["prev_hash"])
    conn.execute(insert(EVENTS), row)


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
            _register_key(conn, signer, stamp, postgres)
            return _sign(conn, signer, stamp, limit)

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
