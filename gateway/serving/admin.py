"""Tenants and keys (admin use cases); each change is an admin audit event."""

from __future__ import annotations

import re
from typing import Any

from gateway.database import Database, TenantExists
from gateway.serving.errors import GatewayError, invalid

TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class AdminService:
    def __init__(self, store: Database) -> None:
        self.store = store

    async def create_tenant(
        self, tenant_id: str, name: str, actor: str = "admin"
    ) -> dict[str, Any]:
        if not TENANT_ID.fullmatch(tenant_id):  # match's $ would allow a final newline
            raise invalid("tenant id must match [a-z0-9][a-z0-9_-]{0,62}", "id")
        if not name.strip():
            raise invalid("tenant name must not be empty", "name")
        try:
            row = await self.store.create_tenant(tenant_id, name, actor=actor)
        except TenantExists:
            raise GatewayError(
                "conflict", f"tenant '{tenant_id}' already exists", param="id", code="tenant_exists"
            ) from None
        return {"id": row["id"], "name": row["name"], "created_at": row["created_at"].isoformat()}

    async def list_tenants(self) -> list[dict[str, Any]]:
        return [
            {"id": t["id"], "name": t["name"], "created_at": t["created_at"].isoformat()}
            for t in await self.store.list_tenants()
        ]

    async def create_key(self, tenant_id: str, role: str, actor: str = "admin") -> dict[str, Any]:
        if await self.store.get_tenant(tenant_id) is None:
            raise GatewayError("not_found", f"no tenant '{tenant_id}'", code="tenant_not_found")
        key_id, key = await self.store.create_key(tenant_id, role, actor=actor)
        return {"id": key_id, "key": key, "role": role, "tenant_id": tenant_id}

    async def revoke_key(self, key_id: str, actor: str = "admin") -> dict[str, Any]:
        if not await self.store.revoke_key(key_id, actor=actor):
            raise GatewayError("not_found", f"no active key '{key_id}'", code="key_not_found")
        return {"id": key_id, "revoked": True}
