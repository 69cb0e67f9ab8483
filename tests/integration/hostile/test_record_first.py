"""Record first, act second (issue 44): a request's admission record is durable before any
byte of its answer leaves, and the final record completes it.

Real server (uvicorn in this process, real sockets), real SQLite file; the database is made
slow or unwritable the way another writer or a broken disk would (its write lock held, a
trigger refusing inserts). Each check runs once more with the admission step switched off
(the gateway before revision 0005_admission_records: its only record written after the
last delta) and must then fail: the negative control."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.serving.generation import GenerationService
from tests.integration.hostile.inproc import Served, served
from tests.integration.service.harness import ADMIN

BLOCKED_S = 2.5
"""How long the database's write lock is held while the client must see nothing."""


@pytest.fixture(params=["record_first", "old_behaviour"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``old_behaviour``: no admission record (the negative control); each test's check
    must then fail."""
    if request.param == "old_behaviour":

        async def no_admission(self: GenerationService, gen: Any) -> None:
            return None

        monkeypatch.setattr(GenerationService, "_record_admission", no_admission)
    yield request.param


def _expect(mode: str) -> Any:
    """The check passes as built, and fails (AssertionError) on the old behaviour."""
    if mode == "record_first":
        return _Nothing()
    return pytest.raises(AssertionError)


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def _stream_while_locked(gw: Served) -> tuple[float | None, str, str]:
    """Send a streamed request while the database's write lock is held for BLOCKED_S: (when
    the first byte arrived, in seconds since the lock was taken, or None if it came only
    after the lock was released; the request id; the body)."""
    first: float | None = None
    released = asyncio.Event()
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        # one request first: the key's last use is then fresh (touch_key writes at most
        # once a while), so the blocked request's only writes are its audit records
        r = await client.post("/v1/completions", json=gw.body(False), headers=gw.auth)
        assert r.status_code == 200, r.text

        async def call() -> tuple[str, str]:
            nonlocal first
            body = gw.body(True)
            async with client.stream("POST", "/v1/completions", json=body, headers=gw.auth) as r:
                if not released.is_set():
                    first = time.perf_counter() - t0
                return r.headers["x-request-id"], (await r.aread()).decode()

        with gw.write_locked():
            t0 = time.perf_counter()
            task = asyncio.ensure_future(call())
            await asyncio.sleep(BLOCKED_S)
            released.set()
        request_id, text = await task
    return first, request_id, text


async def test_no_byte_leaves_before_the_admission_is_durable(
    tiny_manifest: Path, tmp_path: Path, mode: str
) -> None:
    async with served(tiny_manifest, tmp_path) as gw:
        first, request_id, text = await _stream_while_locked(gw)
        assert text.endswith("data: [DONE]\n\n"), text
        with _expect(mode):
            # the old gateway answered at once: its only record came after the last delta
            assert first is None, f"a byte left {first:.3f} s into a blocked audit write"
            admission = _one(gw, "SELECT id FROM audit_admissions WHERE request_id = ?", request_id)
            record = _one(
                gw,
                "SELECT admission_id, status FROM audit_records WHERE request_id = ?",
                request_id,
            )
            assert record == (admission[0], 200)  # the final record completes it


async def test_non_streamed_answer_has_an_admission_and_one_record(
    tiny_manifest: Path, tmp_path: Path, mode: str
) -> None:
    async with served(tiny_manifest, tmp_path) as gw, httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post("/v1/completions", json=gw.body(False), headers=gw.auth)
        assert r.status_code == 200, r.text
        request_id = r.headers["x-request-id"]
        listed = (await c.get("/audit/records", headers=_admin())).json()["data"]
        assert [x["request_id"] for x in listed].count(request_id) == 1  # one request once
        report = (await c.get("/audit/verify", headers=_admin())).json()
        assert report["ok"] and report["incomplete"]["count"] == 0
        with _expect(mode):
            admission = _one(
                gw,
                "SELECT id, tenant_id, prompt_sha256, decision_id FROM audit_admissions "
                "WHERE request_id = ?",
                request_id,
            )
            (row,) = [x for x in listed if x["request_id"] == request_id]
            assert row["admission_id"] == admission[0]
            assert admission[1:] == ("t", row["prompt_sha256"], row["decision_id"])
            assert report["admissions"]["checked"] == 1


async def test_stream_whose_final_write_fails_leaves_an_admission_record(
    tiny_manifest: Path, tmp_path: Path, mode: str
) -> None:
    async with served(tiny_manifest, tmp_path) as gw, httpx.AsyncClient(base_url=gw.url) as c:
        with gw.refusing_inserts("audit_records"):
            r = await c.post("/v1/completions", json=gw.body(True), headers=gw.auth)
            request_id = r.headers["x-request-id"]
        events = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
        assert any(e.get("choices") and e["choices"][0]["text"] for e in events)  # served
        assert events[-1]["error"]["code"] == "audit_unavailable"  # and told: no final record
        assert gw.rows("SELECT 1 FROM audit_records WHERE request_id = ?", request_id) == []
        report = (await c.get("/audit/verify", headers=_admin())).json()
        assert report["ok"], report  # the chains are intact: the request is incomplete
        with _expect(mode):
            # the old gateway kept nothing: the client had the whole text, no record existed
            assert gw.rows("SELECT 1 FROM audit_admissions WHERE request_id = ?", request_id)
            assert report["incomplete"] == {"count": 1, "request_ids": [request_id]}


async def test_fail_closed_refuses_before_any_output_when_the_admission_fails(
    tiny_manifest: Path, tmp_path: Path, mode: str
) -> None:
    async with served(tiny_manifest, tmp_path) as gw, httpx.AsyncClient(base_url=gw.url) as c:
        with gw.refusing_inserts("audit_admissions"):
            r = await c.post("/v1/completions", json=gw.body(True), headers=gw.auth)
        with _expect(mode):
            # the old gateway streamed the whole answer (it wrote no admission to fail)
            assert r.status_code == 503, r.text
            assert r.headers["content-type"].startswith("application/json")
            assert r.json()["error"]["code"] == "audit_unavailable"
            assert "data:" not in r.text
        for _ in range(100):  # its queued run was cancelled at its next step
            if gw.services.worker.depth == 0:
                break
            await asyncio.sleep(0.05)
        assert gw.services.worker.depth == 0


async def test_fail_open_serves_when_the_admission_fails(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    """audit_fail_closed off: the request is served and its final record says it has no
    admission (admission_id null)."""
    async with (
        served(tiny_manifest, tmp_path, audit_fail_closed=False) as gw,
        httpx.AsyncClient(base_url=gw.url) as c,
    ):
        with gw.refusing_inserts("audit_admissions"):
            r = await c.post("/v1/completions", json=gw.body(False), headers=gw.auth)
        assert r.status_code == 200, r.text
        rows = gw.rows(
            "SELECT admission_id, status FROM audit_records WHERE request_id = ?",
            r.headers["x-request-id"],
        )
        assert rows == [(None, 200)]


def _one(gw: Served, sql: str, *args: Any) -> tuple[Any, ...]:
    rows = gw.rows(sql, *args)
    assert len(rows) == 1, f"{len(rows)} rows: {sql}"
    return rows[0]


def _admin() -> dict[str, str]:
    return ADMIN
