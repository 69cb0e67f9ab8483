"""benchmarks/_audit_log.py (``python -m benchmarks.audit --log``) at a small size on a
SQLite file: each mode pays for exactly its own records' leaves (a round starts from a log
that holds every earlier row, the rows an ``off`` round left are caught up between
rounds), every record ends up a leaf, and the proofs' sizes are log2 n hashes."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks._audit_log import KEY, proofs, throughput
from benchmarks.audit import _record
from gateway.database import AuditLog, Database

ROWS = 150


async def test_each_mode_pays_for_its_own_leaves_and_every_record_is_a_leaf(
    tmp_path: Path,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/t.db"
    out = await throughput(url, _record, ROWS, 1)
    assert out["chain_ok"]
    assert all(len(out[f"records_per_s_{m}"]) == 1 for m in ("off", "job", "stress"))
    # the job round started from the log with the off round's rows caught up, all of them
    # and no other (the old protocol charged the job round with them)
    assert out["catch_up_leaves"] == ROWS
    (in_window,) = out["job_leaves_in_window"]  # its first look is 2 s in: most likely 0
    assert in_window is not None and 0 <= in_window <= ROWS + 1
    store = await Database.connect(url)
    try:
        log = AuditLog(store, KEY)
        latest = await log.latest()
        # three rounds of records, and the key's admin event: each a leaf, all signed
        assert await log.size() == 3 * ROWS + 1
        assert latest is not None and latest["tree_size"] == 3 * ROWS + 1
        assert await log.checkpoint() is None  # nothing was left over
    finally:
        await store.close()


async def test_proof_sizes_are_log2_n_hashes(tmp_path: Path) -> None:
    n = 3000
    out = await proofs(tmp_path, n, samples=30)
    assert out["leaves"] == n
    assert out["inclusion_hashes_max"] <= math.ceil(math.log2(n))
    assert out["inclusion_bytes_max"] == 32 * out["inclusion_hashes_max"]
    assert out["consistency_hashes_max"] <= math.ceil(math.log2(n)) + 1
    assert out["inclusion_ms_p50"] > 0 and out["consistency_ms_p50"] > 0
