"""A request whose run fails in a way nobody planned for (a failed shared forward, a bug)
still ends the one way back: its final record is written and its tenant's slot freed.
Before, a non-streamed request's unexpected error left no record and held one of the
tenant's `max_concurrent_requests` slots for good (after 32 such, a 429 until a restart)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.serving import started
from tests.integration.service.harness import sqlite_gateway


async def test_an_unexpected_run_error_is_recorded_and_frees_its_slot(
    tiny_manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing(worker: Any, jobs: Any) -> AsyncIterator[Any]:
        raise RuntimeError("a shared forward failed")
        yield  # an async generator

    monkeypatch.setattr(started, "merged_events", failing)
    async with sqlite_gateway(tiny_manifest, tmp_path) as gw:
        r = await gw.complete("def f(", max_tokens=4)
        assert r.status_code == 500, r.text
        rid = r.headers["x-request-id"]
        assert gw.services.generation.slots.held(gw.tenant) == 0
        records = await gw.records()
        mine = [x for x in records if x["request_id"] == rid]
        assert [x["status"] for x in mine] == [500]
        assert mine[0]["admission_id"] is not None  # it completes its admission
