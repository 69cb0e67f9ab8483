"""Exports of the log as JSON lines, for the offline verifier (verify_export.py).

Whole log (an operator's): one line per leaf, leaf order, from leaf 0 to the log's size when
the export began::

    {"leaf": 0, "kind": "record", "row": {...every stored column, as /audit/records...}}

One tenant's (a tenant auditor's): that tenant's admissions and records only, each with its
inclusion proof against the latest signed checkpoint, so the tenant checks that its requests
are in the log without receiving anyone else's::

    {"leaf": 17, "kind": "record", "row": {...}, "proof": {"tree_size": 40, "hashes": [b64...]}}
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.engine import Connection

from gateway.database.audit import merkle
from gateway.database.audit.log import AuditLog
from gateway.database.audit.log_tables import CHECKPOINTS, LEAVES
from gateway.database.audit.log_tree import KIND_TABLES, log_size, node_source
from gateway.database.audit.note import b64
from gateway.database.audit.queries import to_json_ready

PAGE = 1000


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n"


def _page(conn: Connection, after: int, upper: int) -> list[dict[str, Any]]:
    """Leaves ``after < idx < upper`` (at most PAGE) with their rows."""
    stmt = (
        select(LEAVES)
        .where(LEAVES.c.idx > after, LEAVES.c.idx < upper)
        .order_by(LEAVES.c.idx)
        .limit(PAGE)
    )
    leaves = conn.execute(stmt).all()
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for kind, table in KIND_TABLES.items():
        ids = [int(lf.source_id) for lf in leaves if lf.kind == kind]
        if ids:
            for r in conn.execute(select(table).where(table.c.id.in_(ids))).mappings():
                rows[(kind, int(r["id"]))] = to_json_ready(r)
    return [
        {"leaf": int(lf.idx), "kind": lf.kind, "row": rows[(lf.kind, int(lf.source_id))]}
        for lf in leaves
    ]


async def export_log(log: AuditLog) -> AsyncIterator[str]:
    """Every leaf, in order, up to the log's size when the export began."""
    async with log.store._read() as conn:
        upper = await conn.run_sync(log_size)
    after = -1
    while after + 1 < upper:
        async with log.store._read() as conn:
            page = await conn.run_sync(_page, after, upper)
        if not page:
            return
        for item in page:
            yield _line(item)
        after = page[-1]["leaf"]


def _tenant_page(
    conn: Connection, kind: str, tenant_id: str, after: int, size: int
) -> list[dict[str, Any]]:
    table = KIND_TABLES[kind]
    joined = table.join(LEAVES, and_(LEAVES.c.kind == kind, LEAVES.c.source_id == table.c.id))
    stmt = (
        select(table, LEAVES.c.idx.label("leaf_idx"))
        .select_from(joined)
        .where(table.c.tenant_id == tenant_id, LEAVES.c.idx > after, LEAVES.c.idx < size)
        .order_by(LEAVES.c.idx)
        .limit(PAGE)
    )
    src = node_source(conn)
    out = []
    for r in conn.execute(stmt).mappings():
        row = {k: v for k, v in r.items() if k != "leaf_idx"}
        idx = int(r["leaf_idx"])
        hashes = merkle.inclusion_proof(idx, size, src)
        proof = {"tree_size": size, "hashes": [b64(h) for h in hashes]}
        out.append({"leaf": idx, "kind": kind, "row": to_json_ready(row), "proof": proof})
    return out


async def export_tenant(log: AuditLog, tenant_id: str) -> AsyncIterator[str]:
    """The tenant's admissions, then its records, each with its inclusion proof against
    the latest checkpoint (nothing when none was signed yet)."""
    async with log.store._read() as conn:
        stmt = select(CHECKPOINTS.c.tree_size).order_by(CHECKPOINTS.c.id.desc()).limit(1)
        size = (await conn.execute(stmt)).scalar()
    if size is None:
        return
    for kind in ("admission", "record"):
        after = -1
        while True:
            async with log.store._read() as conn:
                page = await conn.run_sync(_tenant_page, kind, tenant_id, after, int(size))
            for item in page:
                yield _line(item)
            if len(page) < PAGE:
                break
            after = page[-1]["leaf"]
