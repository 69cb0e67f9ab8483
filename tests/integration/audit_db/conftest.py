"""Audit store fixtures over both backends: SQLite (tmp file) and a fresh PostgreSQL DB."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.database import Database, RequestRecord
from tests.pg import fresh_database

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(params=BACKENDS)
async def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path}/audit.db"
    else:
        async with fresh_database("audit") as url:
            yield url


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Database]:
    s = await Database.connect(db_url, upgrade=True)
    yield s
    await s.close()


def record(i: int = 0, **overrides: Any) -> RequestRecord:
    """A served speculative request; ``i`` spaces created_at by minutes."""
    fields: dict[str, Any] = {
        "request_id": f"req-{i}",
        "decision_id": f"dec-{i}",
        "tenant_id": "acme",
        "key_id": "key_1",
        "created_at": T0 + timedelta(minutes=i),
        "endpoint": "/v1/chat/completions",
        "status": 200,
        "requested_mode": "auto",
        "mode": "speculative",
        "reason_codes": ["alpha_above_c"],
        "policy_revision": "rev1",
        "target_model": "tgt",
        "target_version": "1",
        "target_sha256": "a" * 64,
        "proposer": "draft",
        "draft_model": "drf",
        "draft_version": "1",
        "draft_sha256": "b" * 64,
        "k_min": 2,
        "k_max": 6,
        "drafted_tokens": 10,
        "accepted_tokens": 7,
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": 50,
        "seed": 1234,
        "constraint": "none",
        "prompt_tokens": 20,
        "completion_tokens": 9,
        "latency_ms": 12.5,
        "ttft_ms": 3.25,
        "prompt_sha256": None,
        "completion_sha256": None,
    }
    fields.update(overrides)
    return RequestRecord(**fields)


@pytest.fixture
def t0() -> datetime:
    """created_at of ``make_record(0)``."""
    return T0


@pytest.fixture
def make_record() -> Callable[..., RequestRecord]:
    return record
