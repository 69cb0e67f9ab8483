"""Two replicas writing to one PostgreSQL database, each signing checkpoints as it runs:
one log, not one each. Every checkpoint extends the one before it, every row of the three
chains is exactly one leaf, and the whole export verifies offline."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.database import AdminEvent, Admission, AuditLog, Database, Signer
from gateway.database.audit import merkle
from gateway.database.audit.log_export import export_log
from gateway.database.audit.note import Checkpoint, SignedNote, unb64
from gateway.database.audit.verify_export import verify_export
from tests.integration.audit_db.conftest import record
from tests.pg import fresh_database

pytestmark = pytest.mark.postgres
KEY = Signer.generate("gw.test/audit")


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async with fresh_database("auditlog") as url:
        yield url


async def _replica(store: Database, name: str, n: int) -> int:
    """Appends admissions, records and admin events, signing a checkpoint now and then
    (as each replica's checkpoint job does); returns the checkpoints it signed."""
    log = AuditLog(store, KEY)
    signed = 0
    for i in range(n):
        adm = Admission(
            request_id=f"{name}-{i}", tenant_id="acme", endpoint="/v1/completions",
            decision_id=f"d{i}", mode="standard", target_model="t", target_version="1",
            prompt_tokens=3, prompt_sha256="c" * 64,
        )  # fmt: skip
        (aid,) = await store.append([(adm, None)])
        await store.append([(record(i, request_id=f"{name}-{i}", admission_id=aid), None)])
        if i % 7 == 0:
            await store.append_admin(AdminEvent(name, "tenant.updated", "acme"))
        if i % 5 == 4 and await log.checkpoint() is not None:
            signed += 1
    return signed


async def test_two_replicas_write_one_log_with_consistent_checkpoints(pg_url: str) -> None:
    first = await Database.connect(pg_url, upgrade=True)
    second = await Database.connect(pg_url)
    try:
        counts = await asyncio.gather(_replica(first, "a", 30), _replica(second, "b", 30))
        assert all(c > 0 for c in counts)  # both signed, into the one log
        last = await AuditLog(first, KEY).checkpoint()  # whatever came after
        log = AuditLog(second)
        rows = list(reversed(await log.checkpoints(1000)))
        sizes = [r["tree_size"] for r in rows]
        assert sizes == sorted(set(sizes)) and len(sizes) >= sum(counts)
        for old, new in itertools.pairwise(rows):
            proof = await log.consistency(old["tree_size"], new["tree_size"])
            a = Checkpoint.parse(SignedNote.parse(old["note"]).text)
            b = Checkpoint.parse(SignedNote.parse(new["note"]).text)
            hashes = [unb64(h) for h in proof["hashes"]]
            merkle.verify_consistency(a.size, b.size, a.root, b.root, hashes)
        # every row of the three chains is one leaf: 60 admissions, 60 records, 10 events
        # and the key's registration
        assert await log.size() == 60 + 60 + 10 + 1 == (last.size if last else sizes[-1])
        lines = [line async for line in export_log(log)]
        report: dict[str, Any] = verify_export(lines, await log.cosigned_notes(), [KEY.verifier])
        assert report["ok"] and report["verified_size"] == 131, report
        assert (await first.verify())["ok"]
    finally:
        await first.close()
        await second.close()
