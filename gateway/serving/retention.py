"""The retention job: expired prompt/completion payloads deleted on a schedule.

Every ``GATEWAY_RETENTION_INTERVAL_S`` (default hourly; 0: never, when an external job runs
``python -m gateway.database purge`` instead) each replica runs the store's purge: payloads
past their ``expires_at`` (the tenant's ``payload_retention_days`` after the request) are
deleted, each deleting transaction chained as an admin event (``audit.payloads_purged`` by
``gateway:retention``), so the deletion is on the record the console's admin events show.
The first run comes shortly after start (a gateway restarted more often than the interval
still purges). Replicas purging at once do not collide: each deletes what is still there and
records only that. The chain covers payload digests, not texts: ``verify`` stays ok.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from gateway.database import Database
from gateway.database.audit.retention import Purge

log = logging.getLogger("gateway.retention")
ACTOR = "gateway:retention"
"""The admin events' actor for the scheduled purge."""
FIRST_RUN_S = 5.0
"""Delay of the first run after start (the interval's, if shorter)."""


class RetentionJob:
    """Runs :meth:`run_once` every ``interval_s`` seconds in a task of its own."""

    def __init__(self, store: Database, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0 (a disabled job is not started)")
        self.store = store
        self.interval_s = interval_s
        self.last: Purge | None = None
        """The last run's result (None before the first, or when it failed)."""
        self._task: asyncio.Task[None] | None = None

    async def run_once(self, now: datetime | None = None) -> Purge:
        """One purge as of ``now`` (default now); AuditUnavailable when the store refuses."""
        done = await self.store.purge_expired(ACTOR, now)
        if done.purged:
            log.info("retention purged %d expired payloads (events %s)", done.purged, done.events)
        return done

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="retention")

    async def _loop(self) -> None:
        await asyncio.sleep(min(FIRST_RUN_S, self.interval_s))
        while True:
            try:
                self.last = await self.run_once()
            except Exception as exc:  # the database may be down: try again next time
                self.last = None
                log.warning("retention purge failed, retried in %ss: %s", self.interval_s, exc)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        """Cancel the task; a purge in flight rolls back (its events with it)."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


def start_retention(store: Database, interval_s: int) -> RetentionJob | None:
    """The started job, or None when ``interval_s`` is 0 (disabled)."""
    if interval_s < 0:
        raise ValueError(f"GATEWAY_RETENTION_INTERVAL_S must be >= 0, got {interval_s}")
    if interval_s == 0:
        return None
    job = RetentionJob(store, interval_s)
    job.start()
    return job
