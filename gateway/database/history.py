"""The policy engine's acceptance history: EWMA acceptance and c per (tenant, proposer,
draft version), written after each speculative request and read by every replica."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from gateway.database.base import StoreBase, utcnow
from gateway.database.tables import ACCEPTANCE

GLOBAL_TENANT = "*"


class HistoryMixin(StoreBase):
    # -- acceptance history ------------------------------------------------------------------

    async def put_acceptance(
        self,
        tenant_id: str,
        proposer: str,
        draft_version: str,
        *,
        ewma_acceptance: float,
        ewma_c: float,
        samples: int,
    ) -> None:
        """Upsert one history row (``tenant_id='*'`` = global; ``draft_version=''`` for
        proposers without a version)."""
        await self.put_acceptances(
            [(tenant_id, proposer, draft_version, ewma_acceptance, ewma_c, samples)]
        )

    async def put_acceptances(self, rows: list[tuple[str, str, str, float, float, int]]) -> None:
        """Upsert history rows (tenant_id, proposer, draft_version, ewma_acceptance, ewma_c,
        samples) in one transaction: a speculative request's tenant and global rows, one
        commit instead of two."""
        now = utcnow()
        keys = ["tenant_id", "proposer", "draft_version"]
        stmts = [self._upsert_stmt(ACCEPTANCE, _row(*row, now), keys) for row in rows]

        def upsert(conn: Connection) -> None:
            for stmt in stmts:
                conn.execute(stmt)

        await self._transact(upsert)

    async def get_acceptance(
        self, tenant_id: str, proposer: str, draft_version: str
    ) -> dict[str, Any] | None:
        stmt = select(ACCEPTANCE).where(
            ACCEPTANCE.c.tenant_id == tenant_id,
            ACCEPTANCE.c.proposer == proposer,
            ACCEPTANCE.c.draft_version == draft_version,
        )
        async with self._read() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return None if row is None else dict(row)

    async def list_acceptance(self, tenant_id: str | None = None) -> list[dict[str, Any]]:
        """All history rows (for warm-starting the policy engine), optionally one tenant."""
        stmt = select(ACCEPTANCE).order_by(
            ACCEPTANCE.c.tenant_id, ACCEPTANCE.c.proposer, ACCEPTANCE.c.draft_version
        )
        if tenant_id is not None:
            stmt = stmt.where(ACCEPTANCE.c.tenant_id == tenant_id)
        async with self._read() as conn:
            return [dict(r) for r in (await conn.execute(stmt)).mappings()]


def _row(
    tenant: str, proposer: str, version: str, acceptance: float, c: float, samples: int,
    now: datetime,
) -> dict[str, Any]:  # fmt: skip
    return {
        "tenant_id": tenant,
        "proposer": proposer,
        "draft_version": version,
        "ewma_acceptance": float(acceptance),
        "ewma_c": float(c),
        "samples": int(samples),
        "updated_at": now,
    }
