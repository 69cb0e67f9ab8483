"""Database: the gateway's one database, composed of its parts.

- the audit log (gateway.database.audit): request records and admin events in hash chains,
  appends, verification, compliance queries, the batching writer;
- accounts (accounts.py): tenants, API keys, tenant policy documents; named operators and
  key rotation (operators.py);
- rollouts (rollouts.py): registered model versions and draft rollouts;
- history (history.py): the policy engine's acceptance history.

Every mutation of accounts and rollouts with an ``actor=`` chains an admin event in the
same transaction, so one engine (and one migration history) serves them all.
"""

from __future__ import annotations

from sqlalchemy.exc import SQLAlchemyError

from gateway.database.audit.queries import QueryMixin
from gateway.database.audit.records import AuditMixin
from gateway.database.audit.retention import RetentionMixin
from gateway.database.audit.types import AuditUnavailable
from gateway.database.base import DEFAULT_TIMEOUTS, Timeouts, make_engine
from gateway.database.history import HistoryMixin
from gateway.database.operators import OperatorsMixin
from gateway.database.rollouts import RolloutsMixin


class Database(AuditMixin, RetentionMixin, QueryMixin, OperatorsMixin, RolloutsMixin, HistoryMixin):
    """The gateway's database. Create with :meth:`connect`; all methods are coroutines."""

    @classmethod
    async def connect(
        cls, url: str, *, upgrade: bool = False, timeouts: Timeouts = DEFAULT_TIMEOUTS
    ) -> Database:
        """Open ``url`` (any SQLAlchemy async URL). Lazy: a bad database surfaces as
        :class:`AuditUnavailable` on the first write, unless ``upgrade=True`` runs
        ``alembic upgrade head`` now (raising :class:`AuditUnavailable` on failure).
        ``timeouts``: PostgreSQL lock / statement limits of every connection (base.py)."""
        if upgrade:
            from gateway.database.migrate import upgrade_to_head_async

            try:
                await upgrade_to_head_async(url)
            except (SQLAlchemyError, OSError) as exc:
                raise AuditUnavailable(f"cannot migrate audit database: {exc}") from exc
        return cls(make_engine(url, timeouts))

    async def close(self) -> None:
        await self._dispose()
