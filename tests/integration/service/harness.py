"""A running gateway app (Litestar's test client) over a given database, with a tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litestar.testing import AsyncTestClient

from gateway.asgi import create_app
from gateway.settings import Settings

ADMIN_KEY = "sk-admin-integration"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
MODEL = "tiny-target"


@dataclass
class Gateway:
    client: AsyncTestClient[Any]
    app: Any
    tenant: str
    key: str
    auditor_key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}

    @property
    def services(self) -> Any:
        return self.app.state.services

    async def chat(self, content: str = "def add(a, b):", **params: Any) -> Any:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **params}
        return await self.client.post("/v1/chat/completions", json=body, headers=self.auth)

    async def complete(self, prompt: str = "def add(a, b):", **params: Any) -> Any:
        body = {"model": MODEL, "prompt": prompt, **params}
        return await self.client.post("/v1/completions", json=body, headers=self.auth)

    async def records(self, **filters: Any) -> list[dict[str, Any]]:
        r = await self.client.get(
            "/audit/records", params={"limit": 1000, **filters}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
        return r.json()["data"]  # type: ignore[no-any-return]


@asynccontextmanager
async def running_gateway(
    manifest: Path,
    database_url: str,
    var_dir: Path,
    tenant: str = "tenant-a",
    tracer_provider: Any = None,
    **settings: Any,
) -> AsyncIterator[Gateway]:
    s = Settings(
        database_url=database_url,
        admin_key=ADMIN_KEY,
        models=str(manifest),
        var_dir=str(var_dir),
        log_level="warning",
        **settings,
    )
    app = create_app(s, tracer_provider)
    async with AsyncTestClient(app, timeout=120) as client:
        r = await client.post("/admin/tenants", json={"id": tenant, "name": tenant}, headers=ADMIN)
        assert r.status_code == 201, r.text
        r = await client.post(
            f"/admin/tenants/{tenant}/keys", json={"role": "tenant"}, headers=ADMIN
        )
        key = r.json()["key"]
        r = await client.post(
            f"/admin/tenants/{tenant}/keys", json={"role": "auditor"}, headers=ADMIN
        )
        yield Gateway(client, app, tenant, key, r.json()["key"])


@asynccontextmanager
async def sqlite_gateway(manifest: Path, var: Path, **settings: Any) -> AsyncIterator[Gateway]:
    """running_gateway on a fresh SQLite database under `var`."""
    async with running_gateway(manifest, f"sqlite+aiosqlite:///{var}/g.db", var, **settings) as g:
        yield g
