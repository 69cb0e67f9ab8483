"""A tenant cannot make the audit chain read as broken with a float the database rewrites:
SQLite stores -0.0 as 0.0, so a record hashed with "temperature": -0.0 failed verification
from that record on (every auditor then sees tampering that never happened)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.database.audit import records
from tests.integration.service.harness import ADMIN, sqlite_gateway


async def _serve_and_verify(manifest: Path, var: Path) -> dict[str, Any]:
    async with sqlite_gateway(manifest, var) as gw:
        r = await gw.complete("def f(", max_tokens=2, temperature=-0.0)
        assert r.status_code == 200, r.text
        verify = await gw.client.get("/audit/verify", headers=ADMIN)
        return verify.json()  # type: ignore[no-any-return]


async def test_negative_zero_keeps_the_chain_verifiable(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    assert (await _serve_and_verify(tiny_manifest, tmp_path))["ok"] is True


async def test_control_hashing_negative_zero_breaks_the_chain(
    tiny_manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: rows built the old way (-0.0 kept) fail verification."""
    built = records.record_row

    def old_row(record: Any, payload: Any, now: Any) -> dict[str, Any]:
        row = built(record, payload, now)
        if row["temperature"] == 0.0 and str(record.temperature) == "-0.0":
            row["temperature"] = -0.0
        return row

    monkeypatch.setattr(records, "record_row", old_row)
    assert (await _serve_and_verify(tiny_manifest, tmp_path))["ok"] is False
