"""A tenant policy the database refused to store is not in force on this replica either:
every replica then agrees on what the database holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from gateway.database import Database
from gateway.serving.decisions import PolicyService
from gateway.serving.errors import GatewayError
from gateway.serving.ratelimit import Limits
from gateway.settings import ROOT

POLICIES = str(ROOT / "policies" / "bundles")


async def test_a_refused_write_leaves_the_bundle_as_stored(tmp_path: Path) -> None:
    store = await Database.connect(f"sqlite+aiosqlite:///{tmp_path}/p.db", upgrade=True)
    service = PolicyService(store, POLICIES, Limits(10, 1000))
    try:
        await service.start()
        first = {"speculation": {"k": {"min": 1, "max": 2}}}
        await service.put_tenant("acme", first, actor="alice")
        stored = service.describe()
        async with store.engine.begin() as conn:  # the table goes away under the service
            await conn.execute(text("ALTER TABLE policy_documents RENAME TO gone"))
        with pytest.raises(GatewayError) as err:
            await service.put_tenant("acme", {"speculation": {"k": {"min": 1, "max": 3}}}, "bob")
        assert err.value.kind == "unavailable"
        with pytest.raises(GatewayError):
            await service.put_tenant("newco", first, actor="bob")
        now = service.describe()
        assert now["revision"] == stored["revision"]  # the content hash: nothing changed
        assert now["bundle"]["tenants"] == stored["bundle"]["tenants"]
        assert "newco" not in now["bundle"]["tenants"]
    finally:
        await store.close()
