"""One checkpoint run's work inside its transaction (log.py `AuditLog.checkpoint`): the
signing key registered if new, the chains' new rows sequenced as leaves (each checked to
link to the row before it), the tree proved consistent with the last signed checkpoint,
then a checkpoint signed and stored."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, text
from sqlalchemy.engine import Connection

from gateway.database.audit import merkle
from gateway.database.audit.bulk import fetch_rows, placeholders
from gateway.database.audit.chain import EVENT_FIELDS, GENESIS, link
from gateway.database.audit.leaves import leaf_hashes
from gateway.database.audit.log_tables import CHECKPOINTS, SIGNING_KEYS
from gateway.database.audit.log_tree import KIND_TABLES, append_leaves, node_source
from gateway.database.audit.note import Checkpoint, Signer
from gateway.database.audit.types import AuditUnavailable
from gateway.database.base import EVENTS_LOCK, chain_head
from gateway.database.tables_audit import EVENTS

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


def _positions(conn: Connection) -> tuple[int, dict[str, int]]:
    """The log's size and the last row id of each chain that is in it, in one statement of
    index seeks (a max per kind in the (kind, source_id) index; a GROUP BY would read the
    whole index every run)."""
    parts = ["(SELECT max(idx) FROM audit_log_leaves)"] + [
        f"(SELECT max(source_id) FROM audit_log_leaves WHERE kind = '{kind}')"
        for kind in KIND_TABLES
    ]  # the kinds are this module's constants
    top, *last = conn.exec_driver_sql("SELECT " + ", ".join(parts)).one()
    size = 0 if top is None else int(top) + 1
    return size, {kind: int(x or 0) for kind, x in zip(KIND_TABLES, last, strict=True)}


def _new_rows(conn: Connection, last: dict[str, int], limit: int) -> list[tuple[str, int, bytes]]:
    """The chains' rows after ``last`` (at most ``limit``), each checked to link to the row
    before it, as leaves. One query a chain: from its last sequenced row (whose hash the
    first new row must link to) on, three columns, the driver's tuples."""
    out: list[tuple[str, int, bytes]] = []
    for kind, table in KIND_TABLES.items():
        want = limit - len(out)
        if want <= 0:
            break
        after = last[kind]
        marks = placeholders(conn, 2).split(", ")
        sql = (
            f"SELECT id, prev_hash, record_hash FROM {table.name} WHERE id >= {marks[0]} "
            f"ORDER BY id LIMIT {marks[1]}"
        )
        rows = fetch_rows(conn, sql, (after, want + 1 if after else want))
        prev = GENESIS
        if after:
            if not rows or int(rows[0][0]) != after:
                raise _broken(f"{table.name} row {after}, the last one in the log, is gone")
            prev, rows = rows[0][2], rows[1:]
        hashes = [r[2] for r in rows]
        expected = [prev, *hashes][: len(rows)]
        if [r[1] for r in rows] != expected:
            bad = next(r[0] for r, e in zip(rows, expected, strict=True) if r[1] != e)
            raise _broken(f"{table.name} row {bad} does not link to the row before it")
        ids = [int(r[0]) for r in rows]
        out.extend(zip(itertools.repeat(kind), ids, leaf_hashes(kind, hashes), strict=False))
    return out


def _broken(what: str) -> LogBroken:
    return LogBroken(
        f"{what}: the chain was cut or rewritten; not sequenced, no checkpoint signed (run verify)"
    )


def _latest(conn: Connection) -> Any:
    return conn.execute(select(CHECKPOINTS).order_by(CHECKPOINTS.c.id.desc()).limit(1)).first()


def sign_checkpoint(conn: Connection, signer: Signer, now: datetime, limit: int) -> Signed | None:
    size, last_ids = _positions(conn)
    leaves = _new_rows(conn, last_ids, limit)
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


def register_key(conn: Connection, signer: Signer, now: datetime, postgres: bool) -> None:
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
