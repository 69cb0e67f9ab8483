"""Model versions and draft rollouts: simple CRUD for the model registry (which owns the
vocabulary of ``status`` and ``state``; stored as given).

Mutating methods take ``actor=``; when given, ``model.registered``, ``model.status_changed``,
``rollout.started`` and ``rollout.<new state>`` (or ``rollout.updated``) admin events are
chained in the same transaction. Dicts carry ``datetime`` objects (UTC, aware).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import insert, select, update

from gateway.database.audit.types import AdminEvent
from gateway.database.base import StoreBase, utcnow
from gateway.database.tables import MODELS, ROLLOUTS
from gateway.database.tables_shared import SAMPLES

_ROLLOUT_FIELDS = frozenset({"state", "canary_percent", "sticky", "guard", "reason"})


@dataclass(frozen=True, kw_only=True)
class NewModelVersion:
    """A model version to register: the ``models`` row before its ``registered_at``."""

    name: str
    version: str
    role: str
    target: str | None = None
    """The target a draft serves; None for a target."""
    path: str
    sha256: str
    status: str = "registered"


@dataclass(frozen=True, kw_only=True)
class NewRollout:
    """A rollout to start: the ``rollouts`` row before its ``id`` and timestamps."""

    target: str
    draft: str
    version: str
    baseline_version: str | None
    canary_percent: float
    sticky: bool = True
    state: str = "canary"
    guard: dict[str, Any] | None = None
    reason: str | None = None


class RolloutsMixin(StoreBase):
    # -- model versions ----------------------------------------------------------------------

    async def register_model(
        self, model: NewModelVersion, *, actor: str | None = None
    ) -> dict[str, Any]:
        """Insert a model version (IntegrityError if ``name``/``version`` exists)."""
        row = {**asdict(model), "registered_at": utcnow()}
        async with self._write() as conn:
            await conn.execute(insert(MODELS).values(**row))
            if actor is not None:
                after = {k: v for k, v in row.items() if k != "registered_at"}
                subject = f"{model.name}@{model.version}"
                event = AdminEvent(actor, "model.registered", subject, None, after)
                await self._append_event(conn, event)
        return row

    async def get_model(self, name: str, version: str) -> dict[str, Any] | None:
        stmt = select(MODELS).where(MODELS.c.name == name, MODELS.c.version == version)
        async with self._read() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return None if row is None else dict(row)

    async def list_models(
        self, name: str | None = None, role: str | None = None
    ) -> list[dict[str, Any]]:
        stmt = select(MODELS).order_by(MODELS.c.name, MODELS.c.registered_at)
        if name is not None:
            stmt = stmt.where(MODELS.c.name == name)
        if role is not None:
            stmt = stmt.where(MODELS.c.role == role)
        async with self._read() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings()]

    async def set_model_status(
        self, name: str, version: str, status: str, *, actor: str | None = None
    ) -> bool:
        """Change a version's status; False when it does not exist."""
        where = (MODELS.c.name == name, MODELS.c.version == version)
        async with self._write() as conn:
            old = (await conn.execute(select(MODELS.c.status).where(*where))).scalar()
            if old is None:
                return False
            await conn.execute(update(MODELS).where(*where).values(status=status))
            if actor is not None:
                event = AdminEvent(
                    actor,
                    "model.status_changed",
                    f"{name}@{version}",
                    {"status": old},
                    {"status": status},
                )
                await self._append_event(conn, event)
        return True

    # -- rollouts ----------------------------------------------------------------------------

    async def create_rollout(
        self, rollout: NewRollout, *, actor: str | None = None
    ) -> dict[str, Any]:
        """Start a rollout; returns the row with its new ``id``."""
        now = utcnow()
        row: dict[str, Any] = {
            **asdict(rollout),
            "canary_percent": float(rollout.canary_percent),
            "created_at": now,
            "updated_at": now,
        }
        async with self._write() as conn:
            result = await conn.execute(insert(ROLLOUTS).returning(ROLLOUTS.c.id), row)
            row["id"] = int(result.scalar_one())
            if actor is not None:
                after = {k: v for k, v in row.items() if k not in ("created_at", "updated_at")}
                subject = f"rollout:{row['id']}"
                event = AdminEvent(actor, "rollout.started", subject, None, after)
                await self._append_event(conn, event)
        return row

    async def update_rollout(
        self, id: int, *, actor: str | None = None, expect_state: str | None = None, **changes: Any
    ) -> dict[str, Any] | None:
        """Change ``state``, ``canary_percent``, ``sticky``, ``guard`` and/or ``reason``;
        returns the new row, or None when ``id`` does not exist or (``expect_state``) is no
        longer in that state: a compare-and-set, so that of several replicas acting on one
        guard verdict exactly one changes the row and writes the event."""
        unknown = set(changes) - _ROLLOUT_FIELDS
        if unknown:
            raise ValueError(f"cannot update rollout fields {sorted(unknown)}")
        async with self._write() as conn:
            found = await conn.execute(select(ROLLOUTS).where(ROLLOUTS.c.id == id))
            old = found.mappings().first()
            if old is None:
                return None
            values = {**changes, "updated_at": utcnow()}
            stmt = update(ROLLOUTS).where(ROLLOUTS.c.id == id)
            if expect_state is not None:  # row-locked: a second writer re-checks after us
                stmt = stmt.where(ROLLOUTS.c.state == expect_state)
            if (await conn.execute(stmt.values(**values))).rowcount != 1:
                return None
            new = {**dict(old), **values}
            if actor is not None:
                state = changes.get("state")
                action = (
                    f"rollout.{state}" if state and state != old["state"] else "rollout.updated"
                )
                before = {k: old[k] for k in changes}
                event = AdminEvent(actor, action, f"rollout:{id}", before, dict(changes))
                await self._append_event(conn, event)
        return new

    async def get_rollout(self, id: int) -> dict[str, Any] | None:
        async with self._read() as conn:
            row = (await conn.execute(select(ROLLOUTS).where(ROLLOUTS.c.id == id))).mappings()
            found = row.first()
        return None if found is None else dict(found)

    async def list_rollouts(
        self, *, target: str | None = None, draft: str | None = None, state: str | None = None
    ) -> list[dict[str, Any]]:
        stmt = select(ROLLOUTS).order_by(ROLLOUTS.c.id)
        for col, value in (("target", target), ("draft", draft), ("state", state)):
            if value is not None:
                stmt = stmt.where(ROLLOUTS.c[col] == value)
        async with self._read() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings()]

    # -- pooled arm samples ------------------------------------------------------------------

    async def add_rollout_sample(
        self, rollout_id: int, arm: str, *, drafted: int, accepted: int, tokens: int,
        decode_seconds: float, replica: str,
    ) -> None:  # fmt: skip
        """One request an arm served (any replica)."""
        values = {
            "rollout_id": rollout_id, "arm": arm, "drafted": int(drafted),
            "accepted": int(accepted), "tokens": int(tokens),
            "decode_seconds": float(decode_seconds), "replica": replica, "created_at": utcnow(),
        }  # fmt: skip
        async with self._write() as conn:
            await conn.execute(insert(SAMPLES).values(**values))

    async def rollout_samples(
        self, rollout_id: int, arm: str, window: int = 0
    ) -> list[dict[str, Any]]:
        """The arm's samples, oldest first: the newest ``window`` (0 = all)."""
        stmt = (
            select(
                SAMPLES.c.drafted, SAMPLES.c.accepted, SAMPLES.c.tokens, SAMPLES.c.decode_seconds
            )
            .where(SAMPLES.c.rollout_id == rollout_id, SAMPLES.c.arm == arm)
            .order_by(SAMPLES.c.id.desc())
        )
        if window:
            stmt = stmt.limit(window)
        async with self._read() as conn:
            rows = [dict(r) for r in (await conn.execute(stmt)).mappings()]
        return rows[::-1]
