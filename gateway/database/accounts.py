"""Tenants, API keys and policy documents: simple CRUD.

Every mutating method takes ``actor=``; when given, the matching admin event
(``tenant.created``, ``key.created``, ``key.revoked``, ``policy.activated``) is chained in the
SAME transaction, so the change and its audit trail commit together. Dicts returned here carry
``datetime`` objects (UTC, aware), not strings.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.database.audit.types import (
    KEY_ROLES,
    OPERATOR_ROLES,
    AdminEvent,
    KeyInfo,
    TenantExists,
)
from gateway.database.base import POLICIES_LOCK, StoreBase, utcnow
from gateway.database.tables import KEYS, POLICIES, TENANTS
from gateway.database.tables_shared import PRINCIPALS

KEY_PREFIX = "sk-"


def hash_key(plaintext: str) -> str:
    """Hex SHA-256 of an API key secret: the only form stored."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def document_revision(document: dict[str, Any]) -> str:
    """Content hash of a policy document (sorted-key compact JSON)."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


class AccountsMixin(StoreBase):
    # -- tenants ---------------------------------------------------------------------------

    async def create_tenant(
        self, id: str, name: str, *, actor: str | None = None
    ) -> dict[str, Any]:
        """Create a tenant; raises :class:`TenantExists` when ``id`` is taken."""
        row = {"id": id, "name": name, "created_at": utcnow()}
        try:
            async with self._write() as conn:
                exists = await conn.execute(select(TENANTS.c.id).where(TENANTS.c.id == id))
                if exists.first() is not None:
                    raise TenantExists(id)
                await conn.execute(TENANTS.insert().values(**row))
                if actor is not None:
                    after = {"id": id, "name": name}
                    await self._append_event(
                        conn, AdminEvent(actor, "tenant.created", id, None, after)
                    )
        except IntegrityError as exc:  # lost a race with another process
            raise TenantExists(id) from exc
        return row

    async def get_tenant(self, id: str) -> dict[str, Any] | None:
        async with self._read() as conn:
            row = (await conn.execute(select(TENANTS).where(TENANTS.c.id == id))).mappings()
            found = row.first()
        return None if found is None else dict(found)

    async def list_tenants(self) -> list[dict[str, Any]]:
        async with self._read() as conn:
            rows = (await conn.execute(select(TENANTS).order_by(TENANTS.c.id))).mappings()
            return [dict(r) for r in rows]

    # -- API keys --------------------------------------------------------------------------

    async def create_key(
        self,
        tenant_id: str | None,
        role: str,
        *,
        actor: str | None = None,
        principal: str | None = None,
        expires_at: datetime | None = None,
        action: str = "key.created",
        conn: AsyncConnection | None = None,
    ) -> tuple[str, str]:
        """Issue a key; returns ``(key_id, plaintext)``. The plaintext (``sk-...``) is shown
        once: only its SHA-256 and a display prefix are stored. ``role`` is ``tenant``
        (requires an existing tenant) or ``auditor`` (``tenant_id`` may be None); an
        operator key names its ``principal`` and carries the principal's role. ``conn``: run
        inside the caller's write transaction."""
        if role not in (OPERATOR_ROLES if principal else KEY_ROLES):
            raise ValueError(f"unknown key role {role!r}")
        if role == "tenant" and tenant_id is None:
            raise ValueError("a tenant key needs a tenant_id")
        key_id = "key_" + secrets.token_hex(8)
        plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
        row = {
            "id": key_id,
            "tenant_id": tenant_id,
            "role": role,
            "key_hash": hash_key(plaintext),
            "prefix": plaintext[:10],
            "created_at": utcnow(),
            "revoked_at": None,
            "principal": principal,
            "expires_at": expires_at,
        }
        if conn is not None:
            await self._insert_key(conn, row, actor, action)
        else:
            async with self._write() as conn:
                await self._insert_key(conn, row, actor, action)
        return key_id, plaintext

    async def _insert_key(
        self, conn: AsyncConnection, row: dict[str, Any], actor: str | None, action: str
    ) -> None:
        tenant_id = row["tenant_id"]
        if tenant_id is not None:
            found = await conn.execute(select(TENANTS.c.id).where(TENANTS.c.id == tenant_id))
            if found.first() is None:
                raise LookupError(f"no tenant {tenant_id!r}")
        await conn.execute(KEYS.insert().values(**row))
        if actor is not None:
            keep = ("id", "tenant_id", "role", "prefix")
            after = {k: row[k] for k in keep}
            if row["principal"]:
                after["principal"] = row["principal"]
            if row["expires_at"]:
                after["expires_at"] = row["expires_at"].isoformat()
            await self._append_event(conn, AdminEvent(actor, action, row["id"], None, after))

    async def revoke_key(self, key_id: str, *, actor: str | None = None) -> bool:
        """Revoke; False when the key does not exist or was already revoked."""
        now = utcnow()
        async with self._write() as conn:
            stmt = (
                update(KEYS)
                .where(KEYS.c.id == key_id, KEYS.c.revoked_at.is_(None))
                .values(revoked_at=now)
            )
            changed = (await conn.execute(stmt)).rowcount == 1
            if changed and actor is not None:
                event = AdminEvent(
                    actor, "key.revoked", key_id, {"revoked": False}, {"revoked": True}
                )
                await self._append_event(conn, event)
        return changed

    async def lookup_key(self, plaintext: str) -> KeyInfo | None:
        """The key a presented secret belongs to (revoked ones too: check ``revoked``). An
        operator key whose principal is disabled counts as revoked, whatever its row says."""
        cols = ("id", "tenant_id", "role", "revoked_at", "principal", "expires_at", "last_used_at")
        stmt = (
            select(*(KEYS.c[c] for c in cols), PRINCIPALS.c.disabled_at)
            .select_from(KEYS.outerjoin(PRINCIPALS, PRINCIPALS.c.name == KEYS.c.principal))
            .where(KEYS.c.key_hash == hash_key(plaintext))
        )
        row = await self._query(lambda conn: conn.execute(stmt).first())
        if row is None:
            return None
        return KeyInfo(
            id=row.id,
            tenant_id=row.tenant_id,
            role=row.role,
            revoked=row.revoked_at is not None or row.disabled_at is not None,
            principal=row.principal,
            expires_at=row.expires_at,
            last_used_at=row.last_used_at,
        )

    async def list_keys(
        self, tenant_id: str | None = None, *, principal: str | None = None
    ) -> list[dict[str, Any]]:
        """Keys without their hashes (id, tenant_id, role, prefix, principal, created_at,
        last_used_at, expires_at, revoked_at)."""
        cols = [c for c in KEYS.c if c.name != "key_hash"]
        stmt = select(*cols).order_by(KEYS.c.created_at, KEYS.c.id)
        if tenant_id is not None:
            stmt = stmt.where(KEYS.c.tenant_id == tenant_id)
        if principal is not None:
            stmt = stmt.where(KEYS.c.principal == principal)
        async with self._read() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings()]

    # -- policy documents ------------------------------------------------------------------

    async def put_policy(
        self,
        tenant_id: str,
        document: dict[str, Any],
        revision: str | None = None,
        *,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """Activate a new version of ``tenant_id``'s (``*`` = default) policy document.
        ``revision`` defaults to :func:`document_revision`. Returns the stored row."""
        row: dict[str, Any] = {
            "tenant_id": tenant_id,
            "revision": revision or document_revision(document),
            "document": document,
            "activated_at": utcnow(),
        }
        async with self._write() as conn:
            await self._chain_lock(conn, POLICIES_LOCK)  # two replicas putting at once
            prev = (
                (
                    await conn.execute(
                        select(POLICIES.c.version, POLICIES.c.revision)
                        .where(POLICIES.c.tenant_id == tenant_id)
                        .order_by(POLICIES.c.version.desc())
                        .limit(1)
                    )
                )
                .mappings()
                .first()
            )
            row["version"] = 1 if prev is None else prev["version"] + 1
            await conn.execute(POLICIES.insert().values(**row))
            if actor is not None:
                before = None if prev is None else dict(prev)
                after = {"version": row["version"], "revision": row["revision"]}
                event = AdminEvent(actor, "policy.activated", tenant_id, before, after)
                await self._append_event(conn, event)
        return row

    async def active_policy(self, tenant_id: str) -> dict[str, Any] | None:
        """The newest version of ``tenant_id``'s policy document, or None."""
        stmt = (
            select(POLICIES)
            .where(POLICIES.c.tenant_id == tenant_id)
            .order_by(POLICIES.c.version.desc())
            .limit(1)
        )
        async with self._read() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return None if row is None else dict(row)

    async def list_policies(self, tenant_id: str | None = None) -> list[dict[str, Any]]:
        """All versions (newest first per tenant), optionally for one tenant."""
        stmt = select(POLICIES).order_by(POLICIES.c.tenant_id, POLICIES.c.version.desc())
        if tenant_id is not None:
            stmt = stmt.where(POLICIES.c.tenant_id == tenant_id)
        async with self._read() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings()]

    async def latest_policies(self) -> list[dict[str, Any]]:
        """The newest version of every tenant's document (what replicas poll for changes)."""
        newest = (
            select(POLICIES.c.tenant_id, func.max(POLICIES.c.version).label("version"))
            .group_by(POLICIES.c.tenant_id)
            .subquery()
        )
        stmt = select(POLICIES).join(
            newest,
            (POLICIES.c.tenant_id == newest.c.tenant_id) & (POLICIES.c.version == newest.c.version),
        )
        async with self._read() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings()]
