"""Sequencing in batches on both backends (PostgreSQL: the COPY path of audit/bulk.py): the
stored leaves and tree nodes after checkpoints of any size are exactly the RFC 9162 tree
of the chains' rows in log order, every signed root is that tree's, and a chain cut or
relinked across a batch boundary stops the log, naming the row."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from gateway.database import AdminEvent, Admission, AuditLog, Database, LogBroken, Signer
from gateway.database.audit import merkle
from gateway.database.audit.bulk import fetch_rows, insert_rows
from gateway.database.audit.leaves import leaf_from_hash, leaf_hashes
from gateway.database.audit.log_tree import KIND_TABLES
from tests.integration.audit_db.conftest import record

KEY = Signer.generate("gw.test/audit")
NODE_COLS = ("level", "idx", "hash")
STEPS = [1, 7, 16, 3, 50, 2, 64, 5]
"""Checkpoint sizes (``limit``): batches that start and end at odd and even sizes, span
several levels of the tree and cross from one chain to the next."""


async def _fill(store: Database, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        adm = Admission(
            request_id=f"r{i}", tenant_id="acme", endpoint="/v1/completions",
            decision_id=f"d{i}", mode="standard", target_model="t", target_version="1",
            prompt_tokens=3, prompt_sha256="c" * 64,
        )  # fmt: skip
        (aid,) = await store.append([(adm, None)])
        await store.append([(record(i, request_id=f"r{i}", admission_id=aid), None)])
        if i % 4 == 0:
            await store.append_admin(AdminEvent("ops", "tenant.updated", "acme"))


async def _stored(store: Database) -> tuple[list[Any], dict[merkle.Node, bytes]]:
    """The stored leaves (idx, kind, source_id, hash) and every stored perfect node."""
    async with store._read() as conn:
        leaves = (
            await conn.execute(
                text("SELECT idx, kind, source_id, hash FROM audit_log_leaves ORDER BY idx")
            )
        ).all()
        nodes = (await conn.execute(text("SELECT level, idx, hash FROM audit_log_nodes"))).all()
    out = {(0, int(i)): bytes(h) for i, _, _, h in leaves}
    out.update({(int(lv), int(i)): bytes(h) for lv, i, h in nodes})
    return [tuple(r) for r in leaves], out


async def _chain_hashes(store: Database) -> dict[tuple[str, int], str]:
    out = {}
    async with store._read() as conn:
        for kind, table in KIND_TABLES.items():
            rows = await conn.execute(text(f"SELECT id, record_hash FROM {table.name}"))
            out.update({(kind, int(i)): h for i, h in rows})
    return out


async def test_batches_of_any_size_store_exactly_the_rfc_tree(db_url: str) -> None:
    store = await Database.connect(db_url, upgrade=True)
    try:
        log = AuditLog(store, KEY)
        await _fill(store, 20)
        sizes, roots = [], []
        for limit in STEPS * 3:
            signed = await log.checkpoint(limit=limit)
            if signed is None:
                break
            sizes.append(signed.size)
            roots.append(signed.root)
            if len(sizes) == 4:
                await _fill(store, 10, start=20)  # rows arriving between runs
        leaves, nodes = await _stored(store)
        hashes = await _chain_hashes(store)
        order = [(k, int(s)) for _, k, s, _ in leaves]
        assert sorted(order) == sorted(hashes) and len(order) == sizes[-1]  # each row once
        for kind in KIND_TABLES:  # each chain in id order
            ids = [s for k, s in order if k == kind]
            assert ids == sorted(ids)
        tree = merkle.MemoryTree()  # one leaf at a time, from the rows' own hashes
        for kind, sid in order:
            tree.append(leaf_from_hash(kind, hashes[(kind, sid)]))
        assert nodes == tree.nodes  # every perfect node, each stored once, none missing
        assert roots == [tree.root(n) for n in sizes]
        # negative control: the same rows in another order is another tree
        other = merkle.MemoryTree()
        for kind, sid in sorted(order):
            other.append(leaf_from_hash(kind, hashes[(kind, sid)]))
        assert other.root(sizes[-1]) != roots[-1]
    finally:
        await store.close()


def test_batch_leaf_hashes_are_the_rfc_leaf_hashes() -> None:
    hashes = ["0" * 64, "ab" * 32, "f" * 64]
    for kind in KIND_TABLES:
        assert leaf_hashes(kind, hashes) == [leaf_from_hash(kind, h) for h in hashes]
        assert leaf_hashes(kind, hashes) == [
            merkle.leaf_hash(f"{kind}\n{h}".encode()) for h in hashes
        ]
    assert leaf_hashes("record", hashes) != leaf_hashes("event", hashes)  # kind is in it


async def _tamper(store: Database, sql: str) -> None:
    """One write past the append-only triggers (what a DBA can do)."""
    async with store._write() as conn:
        if store.is_sqlite:
            await conn.execute(text("DROP TRIGGER IF EXISTS audit_records_no_update"))
            await conn.execute(text("DROP TRIGGER IF EXISTS audit_records_no_delete"))
        else:
            await conn.execute(text("ALTER TABLE audit_records DISABLE TRIGGER USER"))
        await conn.execute(text(sql), {"h": "e" * 64} if ":h" in sql else {})


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        # the last sequenced record (id 5) relinked: the first new row no longer links
        ("UPDATE audit_records SET record_hash = :h WHERE id = 5", "row 6 does not link"),
        # a new row in the middle of the next batch relinked
        ("UPDATE audit_records SET record_hash = :h WHERE id = 8", "row 9 does not link"),
        # the last sequenced record deleted
        ("DELETE FROM audit_records WHERE id = 5", "row 5, the last one in the log, is gone"),
    ],
)
async def test_a_chain_cut_or_relinked_across_batches_is_never_signed_over(
    db_url: str, sql: str, named: str
) -> None:
    store = await Database.connect(db_url, upgrade=True)
    try:
        log = AuditLog(store, KEY)
        await _fill(store, 12)
        # a run takes admissions (12) before records: this one stops right after record 5
        signed = await log.checkpoint(limit=12 + 5)
        assert signed is not None and signed.size == 12 + 5
        await _tamper(store, sql)
        with pytest.raises(LogBroken, match=f"audit_records {named}"):
            await log.checkpoint()
        assert await log.size() == 12 + 5  # nothing sequenced, nothing signed
        assert (await log.latest() or {})["tree_size"] == 12 + 5
    finally:
        await store.close()


async def test_a_bulk_statement_that_fails_raises_sqlalchemys_error_and_rolls_back(
    db_url: str,
) -> None:
    """A COPY refused by the server (here a duplicate key) is an SQLAlchemyError, as any
    statement's failure (the log turns it into AuditUnavailable), and the transaction is
    rolled back whole; the store goes on."""
    store = await Database.connect(db_url, upgrade=True)
    try:
        row = [(1, 5, bytes(32))]
        await store._transact(lambda c: insert_rows(c, "audit_log_nodes", NODE_COLS, row))
        twice = [(1, 6, bytes(32)), (1, 5, bytes(32))]
        way = "INSERT INTO" if store.is_sqlite else "COPY"  # PostgreSQL: COPY, not per row
        with pytest.raises(SQLAlchemyError, match=f"{way} audit_log_nodes"):
            await store._transact(lambda c: insert_rows(c, "audit_log_nodes", NODE_COLS, twice))
        with pytest.raises(SQLAlchemyError):
            await store._query(lambda c: fetch_rows(c, "SELECT nothing FROM audit_log_nodes"))
        got = await store._query(lambda c: fetch_rows(c, "SELECT level, idx FROM audit_log_nodes"))
        assert [tuple(r) for r in got] == [(1, 5)]  # the failed batch left nothing
        await _fill(store, 2)
        assert (await AuditLog(store, KEY).checkpoint()) is not None
    finally:
        await store.close()
