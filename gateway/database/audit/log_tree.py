"""The log's Merkle tree as the database stores it: leaf hashes in ``audit_log_leaves``,
every perfect subtree above them in ``audit_log_nodes`` (merkle.py computes them); reading
the nodes a proof needs, appending leaves with the nodes they complete."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection

from gateway.database.audit import merkle
from gateway.database.audit.bulk import insert_rows
from gateway.database.audit.log_tables import LEAVES
from gateway.database.tables_audit import ADMISSIONS, EVENTS, RECORDS

KIND_TABLES = {"admission": ADMISSIONS, "record": RECORDS, "event": EVENTS}
"""The chain each kind of leaf names a row of (in the order a run sequences them)."""


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
        # expressions took most of a proof's time, and a
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
    every perfect node they complete; returns the new size. Two bulk inserts (bulk.py: a
    COPY each on asyncpg), whatever the number of leaves."""
    if not leaves:
        return size
    frontier = node_source(conn)(merkle.frontier_nodes(size))
    nodes = merkle.new_nodes(size, [h for _, _, h in leaves], frontier)
    rows = [(size + i, k, s, h) for i, (k, s, h) in enumerate(leaves)]
    insert_rows(conn, "audit_log_leaves", ("idx", "kind", "source_id", "hash"), rows)
    inner = [(lv, ix, h) for (lv, ix), h in nodes[len(leaves) :]]  # new_nodes: leaves first
    insert_rows(conn, "audit_log_nodes", ("level", "idx", "hash"), inner)
    return size + len(leaves)
