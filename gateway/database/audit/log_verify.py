"""The log checked inside the database (``python -m gateway.database verify-log``, ``GET
/audit/log/verify``): an operator's alarm, not the auditor's proof.

It walks every leaf and checks that the row it names still has the hash the leaf was made
from (a row rewritten and re-hashed after it was sequenced, or deleted, no longer does),
rebuilds the tree from the stored leaf hashes and compares its root with every stored
checkpoint's, and checks each checkpoint's signature against the registered keys. All of it
trusts the database it reads (the keys too); the offline verifier (verify_export.py), with
checkpoints from outside the database and a public key obtained out of band, is what an
auditor relies on.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from gateway.database.audit import merkle
from gateway.database.audit.leaves import leaf_from_hash
from gateway.database.audit.log import AuditLog
from gateway.database.audit.log_tables import CHECKPOINTS, LEAVES, SIGNING_KEYS
from gateway.database.audit.log_tree import KIND_TABLES
from gateway.database.audit.note import Checkpoint, NoteError, SignedNote, Verifier

PAGE = 5000


def _leaf_page(conn: Connection, after: int) -> list[tuple[int, str, int, bytes, str | None]]:
    """(idx, kind, source id, stored leaf hash, the row's record_hash or None) of the next
    PAGE leaves."""
    leaves = conn.execute(
        select(LEAVES).where(LEAVES.c.idx > after).order_by(LEAVES.c.idx).limit(PAGE)
    ).all()
    hashes: dict[tuple[str, int], str] = {}
    for kind, table in KIND_TABLES.items():
        ids = [int(lf.source_id) for lf in leaves if lf.kind == kind]
        if ids:
            rows = conn.execute(select(table.c.id, table.c.record_hash).where(table.c.id.in_(ids)))
            hashes.update({(kind, int(i)): str(h) for i, h in rows})
    out = []
    for lf in leaves:
        key = (str(lf.kind), int(lf.source_id))
        out.append((int(lf.idx), key[0], key[1], bytes(lf.hash), hashes.get(key)))
    return out


async def verify_log(log: AuditLog) -> dict[str, Any]:
    """``{"ok", "leaves", "first_mismatch", "checkpoints": {"checked", "first_bad"}}``:
    ``first_mismatch`` names the first leaf whose row is gone or re-hashed,
    ``first_bad`` the first checkpoint whose root or signature does not hold."""
    async with log.store._read() as conn:
        cps = (await conn.execute(select(CHECKPOINTS).order_by(CHECKPOINTS.c.tree_size))).all()
        vkeys = [r[0] for r in (await conn.execute(select(SIGNING_KEYS.c.vkey))).all()]
    keys = [Verifier.parse(v) for v in vkeys]
    at_size = {int(c.tree_size): c for c in cps}
    tree = merkle.MemoryTree()
    mismatch: dict[str, Any] | None = None
    bad: dict[str, Any] | None = None
    after = -1
    while True:
        async with log.store._read() as conn:
            page = await conn.run_sync(_leaf_page, after)
        for idx, kind, sid, stored, record_hash in page:
            if mismatch is None and (
                record_hash is None or leaf_from_hash(kind, record_hash) != stored
            ):
                what = "is gone" if record_hash is None else "was re-hashed after it was sequenced"
                mismatch = {"leaf": idx, "kind": kind, "id": sid, "problem": f"the row {what}"}
            tree.append(stored)
            cp = at_size.get(tree.size)
            if cp is not None and bad is None:
                bad = _check_checkpoint(cp, tree.root(), keys)
        if len(page) < PAGE:
            break
        after = page[-1][0]
    for size, cp in at_size.items():  # a checkpoint beyond the stored leaves
        if size > tree.size and bad is None:
            bad = {"id": int(cp.id), "size": size, "problem": "covers leaves the store lacks"}
    return {
        "ok": mismatch is None and bad is None,
        "leaves": tree.size,
        "first_mismatch": mismatch,
        "checkpoints": {"checked": len(cps), "first_bad": bad},
    }


def _check_checkpoint(cp: Any, root: bytes, keys: list[Verifier]) -> dict[str, Any] | None:
    where = {"id": int(cp.id), "size": int(cp.tree_size)}
    try:
        note = SignedNote.parse(cp.note)
        note.open(keys)
        signed_root = Checkpoint.parse(note.text).root
    except NoteError as exc:
        return {**where, "problem": f"signature: {exc}"}
    if signed_root != root:
        return {**where, "problem": "the stored tree no longer has the signed root"}
    return None
