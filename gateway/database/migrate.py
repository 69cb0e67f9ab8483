"""Run the Alembic migrations programmatically (the gateway upgrades SQLite at start;
production runs ``python -m gateway.database upgrade`` or ``alembic upgrade head`` as a job).

The async variants share one async engine connection with Alembic (``config.attributes
["connection"]``, read by ``migrations/env.py``); the sync ones are safe to call whether or
not an event loop is running.

Replicas that start together may all run ``upgrade head``: on PostgreSQL each takes
``pg_advisory_xact_lock(MIGRATION_LOCK)`` in the migration's transaction first, so one
migrates and the others wait, then find the database at head and do nothing (SQLite: the
first DDL statement takes the database's write lock).
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Connection

from gateway.database.base import make_engine

DEFAULT_URL = "sqlite+aiosqlite:///var/gateway.db"
MIGRATION_LOCK = 0x6D6967726174  # "migrat": one migrating replica at a time


def migrations_dir() -> Path:
    spec = importlib.util.find_spec("migrations")
    if spec is not None and spec.origin is not None:
        found = Path(spec.origin).parent
        if (found / "env.py").exists():
            return found
    return Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


async def _with_connection(url: str, fn: Callable[[Config], None]) -> None:
    if url.startswith("sqlite"):
        database = url.split("///", 1)[-1]
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(url)
    try:
        async with engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # held until this transaction commits
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})

            def run(sync_conn: Connection) -> None:
                cfg = alembic_config(url)
                cfg.attributes["connection"] = sync_conn
                fn(cfg)

            await conn.run_sync(run)
    finally:
        await engine.dispose()


async def upgrade_to_head_async(url: str, revision: str = "head") -> None:
    await _with_connection(url, lambda cfg: command.upgrade(cfg, revision))


async def downgrade_to_base_async(url: str, revision: str = "base") -> None:
    await _with_connection(url, lambda cfg: command.downgrade(cfg, revision))


def _run_blocking(coro: Coroutine[Any, Any, None]) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="alembic")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def upgrade_to_head(url: str = DEFAULT_URL) -> None:
    """``alembic upgrade head`` on ``url`` (blocking)."""
    _run_blocking(upgrade_to_head_async(url))


def downgrade_to_base(url: str = DEFAULT_URL) -> None:
    """``alembic downgrade base`` on ``url`` (blocking): drops every table and trigger."""
    _run_blocking(downgrade_to_base_async(url))
