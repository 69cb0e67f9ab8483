"""Named operators (principals) and the life of a key: create, rotate, touch, disable.

A principal has a name and one role; its keys are ``api_keys`` rows that name it and carry
its role. Like the accounts, each mutation with ``actor=`` chains its admin event
(``principal.created``, ``principal.disabled``, ``key.created``, ``key.rotated``) in the same
transaction. Dicts carry aware UTC datetimes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from gateway.database.accounts import AccountsMixin
from gateway.database.audit.types import OPERATOR_ROLES, AdminEvent
from gateway.database.base import utcnow
from gateway.database.tables import KEYS
from gateway.database.tables_shared import PRINCIPALS

TOUCH_EVERY = timedelta(minutes=1)
"""``last_used_at`` is rewritten at most this often per key (a write, not one per request)."""


class PrincipalExists(Exception):
    """``create_principal`` was given a name that is taken."""


class OperatorsMixin(AccountsMixin):
    async def create_principal(
        self, name: str, role: str, *, actor: str, expires_at: datetime | None = None
    ) -> tuple[dict[str, Any], str, str]:
        """Create a named operator and its first key: ``(row, key id, plaintext)``; raises
        :class:`PrincipalExists` when the name is taken."""
        if role not in OPERATOR_ROLES:
            raise ValueError(f"unknown operator role {role!r}")
        row = {"name": name, "role": role, "created_at": utcnow(), "created_by": actor}
        try:
            async with self._write() as conn:
                found = await conn.execute(
                    select(PRINCIPALS.c.name).where(PRINCIPALS.c.name == name)
                )
                if found.first() is not None:
                    raise PrincipalExists(name)
                await conn.execute(PRINCIPALS.insert().values(**row))
                after = {"name": name, "role": role}
                event = AdminEvent(actor, "principal.created", f"principal:{name}", None, after)
                await self._append_event(conn, event)
                key_id, plaintext = await self.create_key(
                    None, role, actor=actor, principal=name, expires_at=expires_at, conn=conn
                )
        except IntegrityError as exc:  # lost a race with another replica
            raise PrincipalExists(name) from exc
        return {**row, "disabled_at": None}, key_id, plaintext

    async def create_operator_key(
        self, name: str, *, actor: str, expires_at: datetime | None = None
    ) -> tuple[str, str] | None:
        """Another key for an active principal; None when it is unknown or disabled."""
        async with self._write() as conn:
            found = await conn.execute(
                select(PRINCIPALS.c.role).where(
                    PRINCIPALS.c.name == name, PRINCIPALS.c.disabled_at.is_(None)
                )
            )
            role = found.scalar_one_or_none()
            if role is None:
                return None
            return await self.create_key(
                None, role, actor=actor, principal=name, expires_at=expires_at, conn=conn
            )

    async def get_principal(self, name: str) -> dict[str, Any] | None:
        async with self._read() as conn:
            found = await conn.execute(select(PRINCIPALS).where(PRINCIPALS.c.name == name))
            row = found.mappings().first()
        return None if row is None else dict(row)

    async def list_principals(self) -> list[dict[str, Any]]:
        async with self._read() as conn:
            rows = await conn.execute(select(PRINCIPALS).order_by(PRINCIPALS.c.name))
            return [dict(r) for r in rows.mappings()]

    async def disable_principal(self, name: str, *, actor: str) -> bool:
        """Disable a principal and revoke every key it holds; False if none is active."""
        now = utcnow()
        async with self._write() as conn:
            stmt = (
                update(PRINCIPALS)
                .where(PRINCIPALS.c.name == name, PRINCIPALS.c.disabled_at.is_(None))
                .values(disabled_at=now)
            )
            if (await conn.execute(stmt)).rowcount != 1:
                return False
            revoke = (
                update(KEYS)
                .where(KEYS.c.principal == name, KEYS.c.revoked_at.is_(None))
                .values(revoked_at=now)
            )
            revoked = (await conn.execute(revoke)).rowcount
            after = {"disabled": True, "keys_revoked": revoked}
            event = AdminEvent(actor, "principal.disabled", f"principal:{name}", None, after)
            await self._append_event(conn, event)
        return True

    async def rotate_key(
        self, key_id: str, grace: timedelta, *, actor: str, expires_at: datetime | None = None
    ) -> tuple[str, str, datetime] | None:
        """Issue a successor of ``key_id`` (same tenant, role and principal) and let the old
        key live until now + ``grace`` (or its own earlier expiry). Returns ``(new key id,
        plaintext, old key's end)``, or None when ``key_id`` is unknown, revoked or expired."""
        now = utcnow()
        async with self._read() as conn:
            found = await conn.execute(select(KEYS).where(KEYS.c.id == key_id))
            old = found.mappings().first()
        if old is None or old["revoked_at"] is not None:
            return None
        if old["expires_at"] is not None and old["expires_at"] <= now:
            return None
        end = now + grace
        if old["expires_at"] is not None:
            end = min(end, old["expires_at"])
        async with self._write() as conn:
            new_id, plaintext = await self.create_key(
                old["tenant_id"], old["role"], actor=actor, principal=old["principal"],
                expires_at=expires_at, action="key.rotated", conn=conn,
            )  # fmt: skip
            await conn.execute(update(KEYS).where(KEYS.c.id == key_id).values(expires_at=end))
            before = {"expires_at": old["expires_at"].isoformat() if old["expires_at"] else None}
            after = {"expires_at": end.isoformat(), "successor": new_id}
            event = AdminEvent(actor, "key.expiry_set", key_id, before, after)
            await self._append_event(conn, event)
        return new_id, plaintext, end

    async def touch_key(self, key_id: str, last_used_at: datetime | None) -> None:
        """Record a use of the key when the stored one is older than TOUCH_EVERY."""
        now = utcnow()
        if last_used_at is not None and now - last_used_at < TOUCH_EVERY:
            return
        async with self._write() as conn:
            await conn.execute(update(KEYS).where(KEYS.c.id == key_id).values(last_used_at=now))
