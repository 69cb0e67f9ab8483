"""Tenants, keys and named operators (admin use cases); each change is an admin audit event
whose actor is the calling principal's name."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.database import Database, PrincipalExists, TenantExists
from gateway.serving.errors import GatewayError, invalid

TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
OPERATOR_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
RESERVED = frozenset({"admin", "guard", "gateway", "system", "unknown"})
"""Actors the gateway itself writes (``admin`` is the bootstrap key)."""


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _expiry(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.now(UTC) + timedelta(seconds=seconds)


def key_view(row: dict[str, Any]) -> dict[str, Any]:
    """A key as the API lists it: never the secret or its hash."""
    return {
        "id": row["id"],
        "role": row["role"],
        "tenant_id": row["tenant_id"],
        "principal": row.get("principal"),
        "prefix": row["prefix"],
        "created_at": _when(row["created_at"]),
        "last_used_at": _when(row.get("last_used_at")),
        "expires_at": _when(row.get("expires_at")),
        "revoked_at": _when(row["revoked_at"]),
    }


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

    async def create_key(
        self, tenant_id: str, role: str, actor: str = "admin", expires_in_s: int | None = None
    ) -> dict[str, Any]:
        if await self.store.get_tenant(tenant_id) is None:
            raise GatewayError("not_found", f"no tenant '{tenant_id}'", code="tenant_not_found")
        expires = _expiry(expires_in_s)
        key_id, key = await self.store.create_key(tenant_id, role, actor=actor, expires_at=expires)
        out = {"id": key_id, "key": key, "role": role, "tenant_id": tenant_id}
        return {**out, "expires_at": _when(expires)}

    async def revoke_key(self, key_id: str, actor: str = "admin") -> dict[str, Any]:
        if not await self.store.revoke_key(key_id, actor=actor):
            raise GatewayError("not_found", f"no active key '{key_id}'", code="key_not_found")
        return {"id": key_id, "revoked": True}

    async def list_keys(self, tenant_id: str | None = None) -> list[dict[str, Any]]:
        return [key_view(k) for k in await self.store.list_keys(tenant_id)]

    async def rotate_key(
        self, key_id: str, grace_s: int, actor: str, expires_in_s: int | None = None
    ) -> dict[str, Any]:
        """A successor key (shown once); the old one works until the grace period ends. The
        successor keeps the old key's expiry (``expires_in_s`` may only shorten it)."""
        grace = timedelta(seconds=grace_s)
        got = await self.store.rotate_key(
            key_id, grace, actor=actor, expires_at=_expiry(expires_in_s)
        )
        if got is None:
            raise GatewayError(
                "not_found", f"no active key '{key_id}'", param="key_id", code="key_not_found"
            )
        new_id, key, old_end, expires = got
        return {
            "id": new_id,
            "key": key,
            "expires_at": _when(expires),
            "replaces": {"id": key_id, "expires_at": old_end.isoformat()},
        }

    # -- named operators ---------------------------------------------------------------------

    async def create_operator(
        self, name: str, role: str, actor: str, expires_in_s: int | None = None
    ) -> dict[str, Any]:
        if not OPERATOR_NAME.fullmatch(name):
            raise invalid("operator name must match [a-z0-9][a-z0-9._-]{0,63}", "name")
        if name in RESERVED:
            raise invalid(f"'{name}' is reserved for the gateway's own actors", "name")
        expires = _expiry(expires_in_s)
        try:
            row, key_id, key = await self.store.create_principal(
                name, role, actor=actor, expires_at=expires
            )
        except PrincipalExists:
            raise GatewayError(
                "conflict", f"operator '{name}' exists", param="name", code="operator_exists"
            ) from None
        return {
            "name": name,
            "role": role,
            "created_at": _when(row["created_at"]),
            "key": {"id": key_id, "key": key, "expires_at": _when(expires)},
        }

    async def list_operators(self) -> list[dict[str, Any]]:
        keys = await self.store.list_keys()
        return [
            {
                "name": p["name"],
                "role": p["role"],
                "created_at": _when(p["created_at"]),
                "created_by": p["created_by"],
                "disabled_at": _when(p["disabled_at"]),
                "keys": [key_view(k) for k in keys if k["principal"] == p["name"]],
            }
            for p in await self.store.list_principals()
        ]

    async def create_operator_key(
        self, name: str, actor: str, expires_in_s: int | None = None
    ) -> dict[str, Any]:
        expires = _expiry(expires_in_s)
        got = await self.store.create_operator_key(name, actor=actor, expires_at=expires)
        if got is None:
            raise GatewayError(
                "not_found", f"no active operator '{name}'", param="name", code="operator_not_found"
            )
        return {"id": got[0], "key": got[1], "principal": name, "expires_at": _when(expires)}

    async def disable_operator(self, name: str, actor: str) -> dict[str, Any]:
        if not await self.store.disable_principal(name, actor=actor):
            raise GatewayError(
                "not_found", f"no active operator '{name}'", param="name", code="operator_not_found"
            )
        return {"name": name, "disabled": True}
