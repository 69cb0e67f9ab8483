"""Named operators (principals) and the life of a key: create, rotate, touch, disable.

A principal has a name and one role; its keys are ``api_keys`` rows that name it and carry
its role. Like the accounts, each mutation with ``actor=`` chains its admin event
(``principal.created``, ``principal.disabled``, ``key.created``, ``key.rotated``) in the same
transaction. Dicts carry aware UTC datetimes.

A key never outlives what it was issued for: rotation hands the successor the old key's
expiry (an earlier one may be asked, never a later one), and runs its checks and inserts in
one write transaction that holds the principal's row (``FOR UPDATE`` on PostgreSQL; SQLite
writers are serialized by ``BEGIN IMMEDIATE``), so a rotation and a ``disable_principal``
happen one after the other: a disabled principal gets no successor, and a successor issued
first is revoked by the disable. Lookup refuses the keys of a disabled principal even if a
key row escaped the revocation.
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


def successor_expiry(old: datetime | None, asked: datetime | None) -> datetime | None:
    """The expiry of a rotated key's successor: the earlier of the old key's and the one
    asked for (None is never), so rotation cannot lengthen a key's life."""
    if old is None or asked is None:
        return old if asked is None else asked
    return min(old, asked)


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
                select(PRINCIPALS.c.role)
                .where(PRINCIPALS.c.name == name, PRINCIPALS.c.disabled_at.is_(None))
                .with_for_update()  # a concurrent disable waits, then revokes this key too
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
    ) -> tuple[str, str, datetime, datetime | None] | None:
        """Issue a successor of ``key_id`` (same tenant, role and principal) and let the old
        key live until now + ``grace`` (or its own earlier expiry). The successor expires
        when the old key would have (or at ``expires_at`` when that is earlier: see
        :func:`successor_expiry`). Returns ``(new key id, plaintext, old key's end, new
        key's expiry)``, or None when ``key_id`` is unknown, revoked, expired or held by a
        disabled principal. One transaction: checks, insert and the old key's new end."""
        now = utcnow()
        async with self._write() as conn:
            # the principal's row first, then the key's: disable_principal's order (no
            # deadlock); a key's principal never changes, so reading it unlocked is safe
            held = await conn.execute(select(KEYS.c.principal).where(KEYS.c.id == key_id))
            principal = held.scalar_one_or_none()
            if principal is not None:  # locked until commit: a disable waits for us
                active = await conn.execute(
                    select(PRINCIPALS.c.name)
                    .where(PRINCIPALS.c.name == principal, PRINCIPALS.c.disabled_at.is_(None))
                    .with_for_update()
                )
                if active.first() is None:
                    return None
            found = await conn.execute(select(KEYS).where(KEYS.c.id == key_id).with_for_update())
            old = found.mappings().first()
            if old is None or old["revoked_at"] is not None:
                return None
            if old["expires_at"] is not None and old["expires_at"] <= now:
                return None
            end = now + grace
            if old["expires_at"] is not None:
                end = min(end, old["expires_at"])
            expiry = successor_expiry(old["expires_at"], expires_at)
            new_id, plaintext = await self.create_key(
                old["tenant_id"], old["role"], actor=actor, principal=old["principal"],
                expires_at=expiry, action="key.rotated", conn=conn,
            )  # fmt: skip
            await conn.execute(update(KEYS).where(KEYS.c.id == key_id).values(expires_at=end))
            before = {"expires_at": old["expires_at"].isoformat() if old["expires_at"] else None}
            after = {"expires_at": end.isoformat(), "successor": new_id}
            event = AdminEvent(actor, "key.expiry_set", key_id, before, after)
            await self._append_event(conn, event)
        return new_id, plaintext, end, expiry

    async def touch_key(self, key_id: str, last_used_at: datetime | None) -> None:
        """Record a use of the key when the stored one is older than TOUCH_EVERY."""
        now = utcnow()
        if last_used_at is not None and now - last_used_at < TOUCH_EVERY:
            return
        async with self._write() as conn:
            await conn.execute(update(KEYS).where(KEYS.c.id == key_id).values(last_used_at=now))
