"""One checkpoint run's work inside its transaction (log.py `AuditLog.checkpoint`): the
signing key registered if new, the chains' new rows sequenced as leaves (each checked to
link to the row before it), the tree proved consistent with the last signed checkpoint,
then a checkpoint signed and stored."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import Connection

from gateway.database.audit import merkle
from gateway.database.audit.chain import EVENT_FIELDS, GENESIS, link
from gateway.database.audit.leaves import leaf_from_hash
from gateway.database.audit.log_tables import CHECKPOINTS, LEAVES, SIGNING_KEYS
from gateway.database.audit.log_tree import KIND_TABLES, append_leaves, log_size, node_source
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


def sign_checkpoint(conn: Connection, signer: Signer, now: datetime, limit: int) -> Signed | None:
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
