"""The auditor CLI against a SQLite file: export, verify (exit codes), summary, purge."""

from __future__ import annotations

import asyncio
import csv
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.database import Database, Payload, RequestRecord
from gateway.database.cli import EXIT_BROKEN, main

T0 = datetime(2025, 5, 1, tzinfo=UTC)


@pytest.fixture
def db(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "gw.db"
    url = f"sqlite+aiosqlite:///{path}"

    async def seed() -> None:
        store = await Database.connect(url, upgrade=True)
        recs = [
            RequestRecord(
                request_id=f"r{i}",
                endpoint="/v1/chat/completions",
                status=200,
                created_at=T0,
                tenant_id="acme" if i < 3 else "beta",
                mode="speculative",
                drafted_tokens=4,
                accepted_tokens=i % 5,
            )
            for i in range(5)
        ]
        await store.append(
            [(r, Payload("p", "c", 1) if i == 0 else None) for i, r in enumerate(recs)]
        )
        await store.close()

    asyncio.run(seed())
    return url, path


def test_export_verify_summary_purge(
    db: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, path = db
    out = tmp_path / "acme.csv"
    args = ["--database-url", url, "export", "--format", "csv", "--tenant", "acme", "-o", str(out)]
    assert main(args) == 0
    assert [r["request_id"] for r in csv.DictReader(out.open())] == ["r0", "r1", "r2"]
    assert "exported 3 records" in capsys.readouterr().err

    assert main(["--database-url", url, "export", "--since", "2025-05-01T00:00:00Z"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5

    assert main(["--database-url", url, "summary", "--tenant", "beta"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["requests"] == 2 and row["acceptance_rate"] == pytest.approx(7 / 8)

    assert main(["--database-url", url, "purge", "--now", "2025-05-03"]) == 0
    assert json.loads(capsys.readouterr().out) == {"purged": 1, "events": [1]}  # recorded

    assert main(["--database-url", url, "verify"]) == 0
    assert json.loads(capsys.readouterr().out)["checked"] == 5

    with sqlite3.connect(path) as conn:  # an attacker with file access
        conn.execute("DROP TRIGGER audit_records_no_update")
        conn.execute("UPDATE audit_records SET accepted_tokens = 0 WHERE request_id = 'r2'")
    assert main(["--database-url", url, "verify"]) == EXIT_BROKEN
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["first_broken"] == 3


def test_upgrade_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path}/env.db")
    assert main(["upgrade"]) == 0
    assert main(["verify"]) == 0


def test_the_cli_finds_the_gateway_database_where_the_gateway_keeps_it(tmp_path) -> None:
    from gateway.database.cli import default_url

    assert default_url({"GATEWAY_VAR_DIR": str(tmp_path)}) == (
        f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}"
    )  # as Settings.from_env
    assert default_url({"GATEWAY_VAR_DIR": "x", "GATEWAY_DATABASE_URL": "postgresql://h/db"}) == (
        "postgresql://h/db"
    )
