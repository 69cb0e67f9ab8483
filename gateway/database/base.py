"""Engine construction and the two transaction shapes every store method uses.

- ``_write()``: one write transaction. SQLite: ``BEGIN IMMEDIATE`` (takes the database write
  lock up front, so "read last hash + insert" cannot interleave across processes) under a
  per-store asyncio lock (no busy-waiting between this process's own connections).
  PostgreSQL: a plain transaction; chain appends add ``pg_advisory_xact_lock``.
- ``_read()``: a connection for queries (deferred transaction, never blocks writers in WAL).
- ``_transact(body)``, ``_query(body)``: a write transaction, or a query, run by a plain
  function of a synchronous connection: the request path's work (audit appends,
  acceptance history, key lookups). On a SQLite file it runs on one of the store's two
  threads (``SqliteThread``), elsewhere through the async connection (``run_sync``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Executable, Table, create_engine, event, insert, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ResourceClosedError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from gateway.database.audit.chain import EVENT_FIELDS, GENESIS, link
from gateway.database.audit.types import AdminEvent
from gateway.database.tables_audit import EVENTS

#: pg_advisory_xact_lock keys serializing "read last hash + insert" per chain.
RECORDS_LOCK = 0x61756469745F72  # "audit_r"
EVENTS_LOCK = 0x61756469745F65  # "audit_e"
POLICIES_LOCK = 0x706F6C696379  # "policy": "read the newest version + insert the next"
SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",  # durable on commit return
    "PRAGMA foreign_keys=ON",
    "PRAGMA busy_timeout=30000",
)
T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Timeouts:
    """PostgreSQL session limits of the gateway's connections, in milliseconds (0: none).

    Without them one replica stuck inside a transaction (holding the chain's advisory lock
    or a row lock) stalls every other replica's audit appends for as long as it is stuck;
    with them a waiting write fails after ``lock_ms`` and the request gets a 503
    (``audit_unavailable``), and the stuck session itself is ended by the server after
    ``idle_in_transaction_ms`` idle inside its transaction, releasing its locks."""

    lock_ms: int = 5_000
    """``lock_timeout``: longest wait for any lock (tables, rows, the chains' advisory
    locks)."""
    statement_ms: int = 15_000
    """``statement_timeout``: longest run of one statement, lock waits included."""
    idle_in_transaction_ms: int = 60_000
    """``idle_in_transaction_session_timeout``: a session idle this long inside an open
    transaction is ended by the server."""

    def __post_init__(self) -> None:
        for name, ms in self._values().items():
            if ms < 0:
                raise ValueError(f"{name} must be >= 0 ms (0: no limit), got {ms}")

    def _values(self) -> dict[str, int]:
        return {
            "lock_timeout": self.lock_ms,
            "statement_timeout": self.statement_ms,
            "idle_in_transaction_session_timeout": self.idle_in_transaction_ms,
        }

    def server_settings(self) -> dict[str, str]:
        """asyncpg's ``server_settings`` (sent with the connection's start-up message)."""
        return {name: str(ms) for name, ms in self._values().items()}


DEFAULT_TIMEOUTS = Timeouts()


def make_engine(url: str, timeouts: Timeouts | None = None) -> AsyncEngine:
    """An async engine for any SQLAlchemy async URL, tuned for a durable audit log.
    ``timeouts``: PostgreSQL session limits (asyncpg), None for none (migrations, whose
    DDL may rightly run long); ignored by SQLite (its ``busy_timeout`` pragma bounds a
    lock wait)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        connect_args: dict[str, Any] = {"timeout": 10}
        if timeouts is not None and parsed.get_driver_name() == "asyncpg":
            connect_args["server_settings"] = timeouts.server_settings()
        return create_async_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
    engine = create_async_engine(
        parsed,
        connect_args={"timeout": 30},
        **({"poolclass": StaticPool} if _in_memory(parsed) else {}),
    )
    event.listen(engine.sync_engine, "connect", _sqlite_connect)

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _in_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:")


def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    """Every SQLite connection, async or not: WAL, durable commits, foreign keys, and
    SQLAlchemy emitting BEGIN itself (the engines' begin listeners)."""
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    for pragma in SQLITE_PRAGMAS:
        cursor.execute(pragma)
    cursor.close()


class SqliteThread:
    """A synchronous connection to a SQLite file, used on one thread of its own: where the
    store's request-path work runs (``StoreBase._transact`` writes, ``StoreBase._query``
    reads), one hand-off a transaction.

    Why: through aiosqlite every statement is several hand-offs to the connection's thread
    and back (cursor, execute, fetch, close), each resumed on a later turn of the event
    loop; an audit append (begin, chain head, insert, commit, reset) made about fifteen.
    Inside a serving gateway, whose inference thread holds the interpreter lock between
    its kernels, that took 7.4 ms an append and 3.1 ms a key lookup (medians; 2.6 and 1.6
    ms in a process of its own), and a streamed completion's last chunk waits for its
    record. Commits are as durable (the same pragmas); this process's writers stay one at
    a time (the store's write lock), and other processes are kept out by BEGIN IMMEDIATE,
    as before. A reader runs each query in its own implicit transaction (WAL: it never
    waits for a writer)."""

    def __init__(self, url: URL, write: bool) -> None:
        self._engine = create_engine(url.set(drivername="sqlite"), connect_args={"timeout": 30})
        event.listen(self._engine, "connect", _sqlite_connect)
        if write:
            event.listen(self._engine, "begin", _begin_immediate)
        self._write = write
        name = "gw-sqlite-writer" if write else "gw-sqlite-reader"
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._closed = False

    @classmethod
    def for_engine(cls, engine: AsyncEngine, write: bool) -> SqliteThread | None:
        """One for an engine on a SQLite file; None otherwise (an in-memory database is
        the async engine's one connection)."""
        url = engine.url
        if url.get_backend_name() != "sqlite" or _in_memory(url):
            return None
        return cls(url, write)

    async def run(self, body: Callable[[Connection], T]) -> T:
        """``body(conn)``; a writer's in one transaction (committed on return, rolled back
        on a raise). A cancelled caller still waits for a transaction already running
        (then raises CancelledError), so the store's write lock is never released while
        this process writes. Closed: ResourceClosedError, a SQLAlchemyError as any other
        database failure."""
        if self._closed:
            raise ResourceClosedError("the store is closed")
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._thread, self._transaction, body)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            await asyncio.wait({done})
            raise

    def _transaction(self, body: Callable[[Connection], T]) -> T:
        with self._engine.begin() if self._write else self._engine.connect() as conn:
            return body(conn)

    def close(self) -> None:
        """Close the connection on its own thread (sqlite3 refuses any other), then stop;
        once."""
        if self._closed:
            return
        self._closed = True
        self._thread.submit(self._engine.dispose).result()
        self._thread.shutdown()


def _begin_immediate(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


class StoreBase:
    """Holds the engine; mixins add the table-specific methods."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._dialect = engine.dialect.name
        self._write_lock = asyncio.Lock()
        self._writer = SqliteThread.for_engine(engine, write=True)
        self._reader = SqliteThread.for_engine(engine, write=False)

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

    async def _transact(self, body: Callable[[Connection], T], lock: int | None = None) -> T:
        """``body(conn)`` in one write transaction, with a synchronous connection: on a
        SQLite file on the writer thread (``SqliteThread``), otherwise through the async
        connection. ``lock``: the chain's advisory lock (PostgreSQL; SQLite's BEGIN
        IMMEDIATE already holds the database's write lock)."""
        if self._writer is not None:
            async with self._write_lock:
                return await self._writer.run(body)
        async with self._write() as conn:
            if lock is not None:
                await self._chain_lock(conn, lock)
            return await conn.run_sync(body)

    async def _query(self, body: Callable[[Connection], T]) -> T:
        """``body(conn)`` for a query on the request path: on a SQLite file on the reader
        thread (``SqliteThread``), otherwise through the async connection."""
        if self._reader is not None:
            return await self._reader.run(body)
        async with self._read() as conn:
            return await conn.run_sync(body)

    async def _dispose(self) -> None:
        for thread in (self._writer, self._reader):
            if thread is not None:
                await asyncio.to_thread(thread.close)
        await self._engine.dispose()

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        async with self._engine.connect() as conn:
            yield conn

    def _upsert_stmt(self, table: Table, values: dict[str, Any], keys: list[str]) -> Executable:
        """INSERT ... ON CONFLICT (keys) DO UPDATE on SQLite and PostgreSQL."""
        insert = sqlite.insert if self.is_sqlite else postgresql.insert
        stmt = insert(table).values(**values)
        updates = {k: v for k, v in values.items() if k not in keys}
        return stmt.on_conflict_do_update(index_elements=keys, set_=updates)

    async def _append_event(self, conn: AsyncConnection, event: AdminEvent) -> int:
        """Chain ``event`` inside the caller's write transaction (used by CRUD with actor)."""
        await self._chain_lock(conn, EVENTS_LOCK)
        prev = await conn.run_sync(chain_head, EVENTS.c.id, EVENTS.c.record_hash)
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


def chain_head(conn: Connection, id_col: Any, hash_col: Any) -> str:
    """The newest link of a chain (its last row's hash), GENESIS for an empty one."""
    result = conn.execute(select(hash_col).order_by(id_col.desc()).limit(1))
    return result.scalar_one_or_none() or GENESIS
