"""The rollouts as this replica sees them: an in-memory view of the database's rows.

Rollout state lives in the database (``rollouts`` rows, admin events through ``actor=``);
the view reloads it at start, before admin reads, every ``REFRESH_S`` while traffic flows
and from the services' sync loop (gateway.serving.sync), so replicas and restarts agree
within a few seconds. Both the per-request part (traffic.py) and the
admin part (admin.py) read and write rollouts through here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.database import Database
from gateway.database.rollouts import NewModelVersion
from gateway.serving.models import ModelPool
from models_registry.errors import RegistryError
from models_registry.manifest import ModelEntry
from models_registry.rollout import Rollout, RolloutState

log = logging.getLogger("gateway.rollouts")
REFRESH_S = 5.0
ACTIVE = (RolloutState.CANARY, RolloutState.PAUSED)
Detach = Callable[[Coroutine[Any, Any, Any]], None]


def rollout_of(row: dict[str, Any]) -> Rollout:
    fields = {k: row[k] for k in Rollout.__dataclass_fields__}
    fields.update(id=str(row["id"]), guard=row["guard"] or {}, reason=row["reason"] or "")
    return Rollout.from_dict({**fields, "sticky": bool(row["sticky"])})


class RolloutView:
    def __init__(self, store: Database, pool: ModelPool, detach: Detach) -> None:
        self.store = store
        self.pool = pool
        self.detach = detach
        self.rollouts: dict[str, Rollout] = {}
        self.seen: dict[str, Any] = {}  # id -> updated_at of the row last applied
        self._refreshed = 0.0
        self._refreshing = False

    async def refresh(self) -> None:
        """Reload rollouts from the database (other replicas and the guard write them too)."""
        self._refreshed = time.monotonic()
        for row in await self.store.list_rollouts():
            key = str(row["id"])
            old, seen = self.rollouts.get(key), self.seen.get(key)
            if seen is not None and row["updated_at"] <= seen:
                continue
            try:
                new = rollout_of(row)
            except (RegistryError, ValueError) as exc:
                log.error("rollout %s in the database is unusable: %s", key, exc)
                continue
            if old is not None and old.terminal and not new.terminal:
                continue  # a guard rollback not yet written: never revive a finished rollout
            self.rollouts[key] = new
            self.seen[key] = row["updated_at"]

    async def _background_refresh(self) -> None:
        try:
            await self.refresh()
        finally:
            self._refreshing = False

    def maybe_refresh(self) -> None:
        """Pick up other replicas' changes in the background, at most every REFRESH_S."""
        if self._refreshing or time.monotonic() - self._refreshed < REFRESH_S:
            return
        self._refreshing = True
        self.detach(self._background_refresh())

    async def save(self, r: Rollout, actor: str, **changes: Any) -> Rollout:
        row = await self.store.update_rollout(int(r.id), actor=actor, **changes)
        if row is not None:
            self.seen[r.id] = row["updated_at"]
        self.rollouts[r.id] = r
        return r

    async def insert_model(self, e: ModelEntry, status: str, actor: str | None) -> None:
        model = NewModelVersion(
            name=e.name,
            version=e.version,
            role=e.role,
            target=e.target,
            path=str(e.path),
            sha256=e.sha256,
            status=status,
        )
        await self.store.register_model(model, actor=actor)

    async def set_status(self, entry: ModelEntry, status: str, actor: str) -> None:
        """Record a version's status; manifest-file versions get their row on first change."""
        if await self.store.get_model(entry.name, entry.version) is None:
            await self.insert_model(entry, "active", None)
        await self.store.set_model_status(entry.name, entry.version, status, actor=actor)

    def active(self, target: str) -> Rollout | None:
        return next(
            (r for r in self.rollouts.values() if r.target == target and r.state in ACTIVE),
            None,
        )

    def default_version(self, target: str) -> str | None:
        """The last promoted draft version of ``target`` still registered, else None."""
        have = set(self.pool.draft_versions(target))
        promoted = [
            r
            for r in self.rollouts.values()
            if r.target == target and r.state is RolloutState.PROMOTED and r.version in have
        ]
        return max(promoted, key=lambda r: int(r.id)).version if promoted else None

    def entry(self, name: str, version: str) -> ModelEntry | None:
        return next(
            (e for e in self.pool.manifest.entries if e.name == name and e.version == version), None
        )

    async def finish_rollback(
        self, r: Rollout, actor: str, *, expect_state: str | None = None
    ) -> bool:
        """Write the rollback, unload the draft and mark its version registered. With
        ``expect_state`` the write is a compare-and-set: when another replica (or an operator)
        changed the row first, nothing is written, the view reloads the row, and False is
        returned."""
        row = await self.store.update_rollout(
            int(r.id), actor=actor, expect_state=expect_state, state=r.state.value,
            reason=r.reason,
        )  # fmt: skip
        self.pool.unload_draft(r.draft, r.version)  # requests in flight keep their reference
        if row is None and expect_state is not None:
            self.rollouts.pop(r.id, None)
            self.seen.pop(r.id, None)
            await self.refresh()
            return False
        if row is not None:
            self.seen[r.id] = row["updated_at"]
        self.rollouts[r.id] = r
        entry = self.entry(r.draft, r.version)
        if entry is not None:
            await self.set_status(entry, "registered", actor)
        return True
