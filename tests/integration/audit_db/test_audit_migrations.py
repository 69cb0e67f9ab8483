"""Alembic up/down on SQLite and PostgreSQL; the ORM models match the migrations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from gateway.database.base import make_engine
from gateway.database.migrate import downgrade_to_base_async, upgrade_to_head, upgrade_to_head_async
from gateway.database.tables import Base

ROOT = Path(__file__).resolve().parents[3]
TABLES = {
    "audit_records", "audit_payloads", "admin_events", "audit_admissions", "tenants", "api_keys",
    "acceptance_stats", "model_versions", "rollouts", "policy_documents", "principals",
    "rollout_samples", "audit_log_leaves", "audit_log_nodes", "audit_checkpoints",
    "audit_cosignatures", "audit_signing_keys",
}  # fmt: skip
CHAINED = (
    "audit_records", "admin_events", "audit_admissions",
    # revision 0006: the verifiable log's tables
    "audit_log_leaves", "audit_log_nodes", "audit_checkpoints", "audit_cosignatures",
    "audit_signing_keys",
)  # fmt: skip
"""The append-only tables (triggers refuse UPDATE, DELETE, TRUNCATE)."""


def _inspect(conn: Connection) -> dict[str, Any]:
    ctx = MigrationContext.configure(conn, opts={"compare_type": True})
    if conn.dialect.name == "postgresql":
        q = "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
    else:
        q = "SELECT name FROM sqlite_master WHERE type = 'trigger'"
    return {
        "diff": compare_metadata(ctx, Base.metadata),
        "tables": set(inspect(conn).get_table_names()) - {"alembic_version", "sqlite_sequence"},
        "triggers": {row[0] for row in conn.execute(text(q))},
    }


async def _state(url: str) -> dict[str, Any]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(_inspect)
    finally:
        await engine.dispose()


async def test_upgrade_matches_models_and_downgrade_removes_everything(db_url: str) -> None:
    await upgrade_to_head_async(db_url)
    state = await _state(db_url)
    assert state["diff"] == []
    assert state["tables"] == TABLES
    if db_url.startswith("postgresql"):
        expected = {f"{t}_{s}" for t in CHAINED for s in ("append_only", "no_truncate")}
    else:
        expected = {f"{t}_no_{v}" for t in CHAINED for v in ("update", "delete")}
    assert state["triggers"] == expected
    await downgrade_to_base_async(db_url)
    state = await _state(db_url)
    assert state["tables"] == set() and state["triggers"] == set()
    await upgrade_to_head_async(db_url)  # the cycle repeats cleanly
    assert (await _state(db_url))["diff"] == []


async def test_sync_helper_works_inside_a_running_loop(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/nested/sync.db"
    upgrade_to_head(url)
    assert (await _state(url))["tables"] == TABLES


def test_alembic_cli_reads_url_from_x_argument(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/cli.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    alembic = [sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "-x", f"url={url}"]
    subprocess.run(
        [*alembic, "upgrade", "head"], check=True, env=env, cwd=ROOT, capture_output=True
    )
    out = subprocess.run([*alembic, "current"], check=True, env=env, cwd=ROOT, capture_output=True)
    assert b"0007_reasoning_tokens (head)" in out.stdout
