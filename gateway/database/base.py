"""Engine construction and the two transaction shapes every store method uses.

- ``_write()``: one write transaction. SQLite: ``BEGIN IMMEDIATE`` (takes the database write
  lock up front, so "read last hash + insert" cannot interleave across processes) under a
  per-store asyncio lock (no busy-waiting between this process's own connections).
  PostgreSQL: a plain transaction; chain appends add ``pg_advisory_xact_lock``.
- ``_read()``: a connection for queries (deferred transaction, never blocks writers in WAL).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, event, insert, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from gateway.database.audit.chain import EVENT_FIELDS, GENESIS, link
from gateway.database.audit.types import AdminEvent
from gateway.database.tables import EVENTS

#: pg_advisory_xact_lock keys serializing "read last hash + insert" per chain.
RECORDS_LOCK = 0x61756469745F72  # "audit_r"
EVENTS_LOCK = 0x61756469745F65  # "audit_e"
POLICIES_LOCK = 0x706F6C696379  # "policy": "read the newest version + insert the next"


def utcnow() -> datetime:
    return datetime.now(UTC)


def make_engine(url: str) -> AsyncEngine:
    """An async engine for any SQLAlchemy async URL, tuned for a durable audit log."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_async_engine(parsed, pool_pre_ping=True, connect_args={"timeout": 10})
    memory = parsed.database in (None, "", ":memory:")
    engine = create_async_engine(
        parsed,
        connect_args={"timeout": 30},
        **({"poolclass": StaticPool} if memory else {}),
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
        cursor = dbapi_conn.cursor()
        for pragma in (
            "PRAGMA journal_mode=WAL",
            "PRAGMA synchronous=FULL",  # durable on commit return
            "PRAGMA foreign_keys=ON",
            "PRAGMA busy_timeout=30000",
        ):
            cursor.execute(pragma)
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


class StoreBase:
    """Holds the engine; mixins add the table-specific methods."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._dialect = engine.dialect.name
        self._write_lock = asyncio.Lock()

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @property
    def is_sqlite(self) -> bool:
        return self._dialect == "sqlite"

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        if not self.is_sqlite:
            async with self._engine.connect() as conn, conn.begin():
                yield conn
            return
        async with self._write_lock, self._engine.connect() as conn:
            conn = await conn.execution_options(sqlite_begin="IMMEDIATE")
            async with conn.begin():
                yield conn

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        async with self._engine.connect() as conn:
            yield conn

    async def _upsert(
        self, conn: AsyncConnection, table: Table, values: dict[str, Any], keys: list[str]
    ) -> None:
        """INSERT ... ON CONFLICT (keys) DO UPDATE on SQLite and PostgreSQL."""
        insert = sqlite.insert if self.is_sqlite else postgresql.insert
        stmt = insert(table).values(**values)
        updates = {k: v for k, v in values.items() if k not in keys}
        await conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=updates))

    async def _append_event(self, conn: AsyncConnection, event: AdminEvent) -> int:
        """Chain ``event`` inside the caller's write transaction (used by CRUD with actor)."""
        await self._chain_lock(conn, EVENTS_LOCK)
        prev = await self._head(conn, EVENTS.c.id, EVENTS.c.record_hash)
        row: dict[str, Any] = {
            "actor": event.actor,
            "action": event.action,
            "subject": event.subject,
            "before": event.before,
            "after": event.after,
            "created_at": event.created_at or utcnow(),
            "prev_hash": prev,
        }
        row["record_hash"] = link(row, EVENT_FIELDS, prev)
        result = await conn.execute(insert(EVENTS).returning(EVENTS.c.id), row)
        return int(result.scalar_one())

    async def _chain_lock(self, conn: AsyncConnection, key: int) -> None:
        if not self.is_sqlite:  # SQLite already holds the write lock (BEGIN IMMEDIATE)
            await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})

    @staticmethod
    async def _head(conn: AsyncConnection, id_col: Any, hash_col: Any) -> str:
        result = await conn.execute(select(hash_col).order_by(id_col.desc()).limit(1))
        return result.scalar_one_or_none() or GENESIS
