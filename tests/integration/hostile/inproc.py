"""A real uvicorn server around the whole app, in this test's process and event loop, on a
SQLite file: real sockets (a client sees when the first byte arrives, and can hang up) while
the test can still reach the services (block the inference thread, read the database, patch
a step for a negative control)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from gateway.__main__ import GracefulServer
from gateway.asgi import create_app
from gateway.settings import Settings
from tests.integration.service.harness import ADMIN, ADMIN_KEY, MODEL
from tests.integration.service.process import free_port


@dataclass
class Served:
    app: Any
    url: str
    key: str
    db: Path
    server: uvicorn.Server
    task: asyncio.Task[None]

    async def shut_down(self) -> None:
        """What SIGTERM does: uvicorn's graceful shutdown, then the app's."""
        self.server.should_exit = True
        await asyncio.wait_for(self.task, 60)

    @property
    def services(self) -> Any:
        return self.app.state.services

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}

    def body(self, stream: bool, **params: Any) -> dict[str, Any]:
        """A completion request. Standard decoding: a speculative one may load its draft
        model on the inference thread before it is queued, and the tests block that thread."""
        return {
            "model": MODEL, "prompt": "def add(a, b):", "max_tokens": 6, "temperature": 0,
            "stream": stream, "decoding": {"mode": "standard"}, **params,
        }  # fmt: skip

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """A query on a connection of our own (what is durable, as another process sees it)."""
        with sqlite3.connect(self.db) as conn:
            return conn.execute(sql, args).fetchall()

    @contextmanager
    def write_locked(self) -> Iterator[None]:
        """Hold the database's write lock (as another writer would): the gateway's audit
        writes wait until the block ends; reads go on (WAL)."""
        conn = sqlite3.connect(self.db, isolation_level=None, timeout=30)
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()

    @contextmanager
    def refusing_inserts(self, table: str) -> Iterator[None]:
        """Every INSERT into `table` fails (a database that cannot take that write)."""
        name = f"test_refuse_{table}"
        self.rows(
            f"CREATE TRIGGER {name} BEFORE INSERT ON {table} "
            "BEGIN SELECT RAISE(ABORT, 'injected: the audit store cannot be written'); END"
        )
        try:
            yield
        finally:
            self.rows(f"DROP TRIGGER {name}")

    @asynccontextmanager
    async def inference_blocked(self) -> AsyncIterator[threading.Event]:
        """Occupy the inference thread (as one long decode step would) until the returned
        event is set, or the block ends."""
        release, running = threading.Event(), threading.Event()

        def block() -> None:
            running.set()
            release.wait(30)

        call = asyncio.ensure_future(self.services.worker.call(block))
        while not running.is_set():
            await asyncio.sleep(0.01)
        try:
            yield release
        finally:
            release.set()
            await call


@asynccontextmanager
async def served(manifest: Path, var: Path, **settings: Any) -> AsyncIterator[Served]:
    db = var / "g.db"
    s = Settings(
        database_url=f"sqlite+aiosqlite:///{db}", admin_key=ADMIN_KEY, models=str(manifest),
        var_dir=str(var), log_level="warning", measure_costs=False, **settings,
    )  # fmt: skip
    app = create_app(s)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = GracefulServer(config, app, s.shutdown_grace_s)  # what `python -m gateway` runs
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            r = await client.post("/admin/tenants", json={"id": "t", "name": "T"}, headers=ADMIN)
            assert r.status_code == 201, r.text
            r = await client.post("/admin/tenants/t/keys", json={"role": "tenant"}, headers=ADMIN)
            key = r.json()["key"]
        yield Served(app, url, key, db, server, task)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 60)
