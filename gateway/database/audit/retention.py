"""Payload retention: expired prompt/completion texts deleted, and each deletion recorded.

A payload row (``audit_payloads``) holds the texts of one record for the tenant's
``retention_days``; its ``expires_at`` is when it must go. The chain never covers the texts,
only their SHA-256 digests on the record, so deleting a payload leaves both chains
verifiable (``verify`` checks the payloads that survive, and nothing else).

:meth:`RetentionMixin.purge_expired` deletes in transactions of at most ``batch``
payloads (the longest expired first); each transaction deletes its payloads and chains one
admin event (action ``audit.payloads_purged``, subject ``audit_payloads``) that names the
cutoff, how many were deleted and the lowest and highest record id among them, so the
deletion and its record commit together or not at all. A transaction that finds nothing
expired writes nothing (a job that runs every hour on every replica would otherwise fill the
admin events with no-ops), unless ``record_empty`` (an operator's manual purge is always
recorded). Each statement is one bounded SELECT or DELETE, so PostgreSQL's statement
timeout applies to a batch, not to the whole backlog.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.exc import SQLAlchemyError

from gateway.database.audit.chain import format_datetime
from gateway.database.audit.types import AdminEvent, AuditUnavailable
from gateway.database.base import StoreBase, utcnow
from gateway.database.tables_audit import PAYLOADS

PURGE_ACTION = "audit.payloads_purged"
"""The admin event of one purge transaction."""
PURGE_SUBJECT = "audit_payloads"
PURGE_BATCH = 5000
"""Payloads one purge transaction deletes at most."""


@dataclass(frozen=True)
class Purge:
    """What one purge did."""

    purged: int
    """Payloads deleted, all transactions together."""
    events: tuple[int, ...]
    """Ids of the admin events that record it (one per transaction that wrote)."""
    cutoff: datetime
    """Payloads whose ``expires_at`` <= this were deleted."""


class RetentionMixin(StoreBase):
    """Deletion of expired payloads, recorded in the admin events (part of Database)."""

    async def purge_expired(
        self,
        actor: str,
        now: datetime | None = None,
        *,
        batch: int = PURGE_BATCH,
        record_empty: bool = False,
    ) -> Purge:
        """Delete every payload with ``expires_at`` <= ``now`` (default: now), ``batch`` at a
        time, each batch in one transaction with its admin event by ``actor``. Raises
        AuditUnavailable when the database refuses (what was committed before stays)."""
        if batch < 1:
            raise ValueError("batch must be >= 1")
        cutoff = now or utcnow()
        purged, events = 0, []
        try:
            while True:
                found, deleted, event = await self._purge_batch(actor, cutoff, batch, record_empty)
                purged += deleted
                if event is not None:
                    events.append(event)
                    record_empty = False  # the run is on record
                if found < batch:
                    return Purge(purged, tuple(events), cutoff)
        except (SQLAlchemyError, OSError) as exc:
            raise AuditUnavailable(f"payload purge failed: {exc}") from exc

    async def _purge_batch(
        self, actor: str, cutoff: datetime, batch: int, record_empty: bool
    ) -> tuple[int, int, int | None]:
        """One transaction: (payloads found expired, deleted, the event's id or None). A
        replica purging at the same moment may delete some first: only what this one
        deleted is counted and recorded."""
        expired = (
            select(PAYLOADS.c.record_id)
            .where(PAYLOADS.c.expires_at <= cutoff)
            .order_by(PAYLOADS.c.expires_at, PAYLOADS.c.record_id)  # its index
            .limit(batch)
        )
        async with self._write() as conn:
            ids = [int(r) for r in (await conn.execute(expired)).scalars()]
            deleted = 0
            if ids:
                result = await conn.execute(delete(PAYLOADS).where(PAYLOADS.c.record_id.in_(ids)))
                deleted = int(result.rowcount)
            if not deleted and not record_empty:
                return len(ids), 0, None
            after = {
                "purged": deleted,
                "cutoff": format_datetime(cutoff),
                "first_record_id": min(ids) if deleted else None,
                "last_record_id": max(ids) if deleted else None,
            }
            event = AdminEvent(actor, PURGE_ACTION, PURGE_SUBJECT, None, after)
            return len(ids), deleted, await self._append_event(conn, event)
