"""Abandoned work stops (issue 44): a non-streamed request whose client hung up is cancelled
at its next step and recorded 499, as a stream is; a shutdown gives the requests in flight a
bounded grace (GATEWAY_SHUTDOWN_GRACE_S), then ends them and records them (503,
``shutting_down``).

Real server (uvicorn in this process, with the shutdown hook `python -m gateway` runs), real
sockets, real SQLite; the inference thread is held busy, as one long decode step would hold
it, so that the requests are still running when their client or the server goes. Each check
runs once more with the old behaviour put back and must then fail (the negative control)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.http import openai
from gateway.serving.recorder import Recorder
from tests.integration.hostile.inproc import Served, served


def _expect(mode: str) -> Any:
    """The check passes as built, and fails (AssertionError) on the old behaviour."""
    return pytest.raises(AssertionError) if mode == "old_behaviour" else _Nothing()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture(params=["stops", "old_behaviour"])
def gone_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``old_behaviour``: a non-streamed handler waits for its result whoever listens."""
    if request.param == "old_behaviour":

        async def collect(_request: Any, gen: Any) -> Any:
            return await gen.collect()

        monkeypatch.setattr(openai, "_collect", collect)
    yield request.param


async def _until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(predicate())


async def _warm(gw: Served) -> None:
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
        r = await c.post("/v1/completions", json=gw.body(False), headers=gw.auth)
        assert r.status_code == 200, r.text


async def test_non_streamed_client_gone_is_cancelled_and_recorded_499(
    tiny_manifest: Path, tmp_path: Path, gone_mode: str
) -> None:
    async with served(tiny_manifest, tmp_path) as gw:
        await _warm(gw)
        async with gw.inference_blocked():
            async with httpx.AsyncClient(base_url=gw.url, timeout=0.5) as c:
                with pytest.raises(httpx.ReadTimeout):  # the client gives up and hangs up
                    body = gw.body(False, max_tokens=200)
                    await c.post("/v1/completions", json=body, headers=gw.auth)
            # its record is written at once, while the inference thread is still busy
            recorded = await _until(
                lambda: gw.rows("SELECT 1 FROM audit_records WHERE status = 499"), 5
            )
            with _expect(gone_mode):
                # the old handler kept waiting for a result nobody would read
                assert recorded, "no 499 record while the request's client is gone"
        # the thread freed, the cancelled job ends at its next step instead of decoding
        assert await _until(lambda: gw.services.worker.depth == 0, 20)
        rows = gw.rows(
            "SELECT status, completion_tokens, admission_id IS NOT NULL FROM audit_records "
            "WHERE id > 1"
        )
        with _expect(gone_mode):
            # the old one decoded all 200 tokens and recorded 200
            assert rows == [(499, 0, 1)], rows


@pytest.fixture(params=["bounded", "old_behaviour"])
def grace_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``old_behaviour``: a shutdown waits for every request in flight to finish."""
    if request.param == "old_behaviour":

        async def close_open(self: Recorder, grace_s: float) -> int:
            return 0

        monkeypatch.setattr(Recorder, "close_open", close_open)
    yield request.param


GRACE_S = 1


async def test_shutdown_grace_is_bounded_then_ends_and_records_what_is_left(
    tiny_manifest: Path, tmp_path: Path, grace_mode: str
) -> None:
    async with served(tiny_manifest, tmp_path, shutdown_grace_s=GRACE_S) as gw:
        await _warm(gw)
        recorder = gw.services.recorder
        async with (
            gw.inference_blocked() as release,
            httpx.AsyncClient(base_url=gw.url, timeout=60) as c,
        ):
            body = gw.body(False, max_tokens=200)
            plain = asyncio.ensure_future(c.post("/v1/completions", json=body, headers=gw.auth))
            streamed = asyncio.ensure_future(
                c.post("/v1/completions", json={**body, "stream": True}, headers=gw.auth)
            )
            assert await _until(lambda: recorder.open_requests == 2, 10)
            t0 = time.monotonic()
            shutdown = asyncio.ensure_future(gw.shut_down())  # SIGTERM
            await asyncio.sleep(GRACE_S + 1.5)  # the grace is over; the long step goes on
            ended_in_grace = plain.done()
            release.set()
            r_plain, r_stream = await plain, await streamed
        await shutdown
        took = time.monotonic() - t0
        rows = gw.rows("SELECT status, error_type FROM audit_records WHERE id > 1 ORDER BY id")
        with _expect(grace_mode):
            # the old shutdown waited for both to decode all 200 tokens (15 s here)
            assert took < GRACE_S + 8, f"the shutdown took {took:.1f} s"
            assert ended_in_grace, "the non-streamed request outlived the grace"
            assert r_plain.status_code == 503
            assert r_plain.json()["error"]["code"] == "shutting_down"
            last = json.loads(r_stream.text.strip().split("\n\n")[-1][6:])
            assert last["error"]["code"] == "shutting_down"
            assert rows == [(503, "unavailable"), (503, "unavailable")], rows
