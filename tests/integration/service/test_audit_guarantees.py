"""Nothing served unaudited: fail-closed when the store is gone, no record lost under
concurrency, and none lost when the gateway shuts down with requests in flight."""

from __future__ import annotations

import asyncio
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from gateway.database import Database, RecordFilter
from tests.integration.service.harness import ADMIN, MODEL, running_gateway
from tests.integration.service.process import start_gateway
from tests.pg import admin_engine, fresh_database


async def test_store_down_means_503_and_no_completion(tiny_manifest: Path, tmp_path: Path) -> None:
    async with (
        fresh_database("failclosed") as url,
        running_gateway(tiny_manifest, url, tmp_path) as gw,
    ):
        ok = await gw.complete(max_tokens=4)
        assert ok.status_code == 200
        name = make_url(url).database
        engine = admin_engine()
        async with engine.connect() as conn:
            await conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        await engine.dispose()
        r = await gw.complete(max_tokens=4)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] in {"audit_unavailable", "database_unavailable"}
        assert "choices" not in r.json()
        assert int(r.headers["retry-after"]) >= 1


async def test_concurrent_requests_each_get_one_record(tiny_manifest: Path, tmp_path: Path) -> None:
    async with running_gateway(
        tiny_manifest, f"sqlite+aiosqlite:///{tmp_path}/c.db", tmp_path, max_active=4
    ) as gw:
        responses = await asyncio.gather(*(gw.complete(f"x{i}", max_tokens=3) for i in range(16)))
        assert all(r.status_code == 200 for r in responses)
        ids = {r.headers["x-request-id"] for r in responses}
        stored = {x["request_id"] for x in await gw.records()}
        assert ids <= stored
        verify = await gw.client.get("/audit/verify", headers=ADMIN)
        assert verify.json()["ok"] is True


def test_shutdown_with_requests_in_flight_loses_no_record(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path}/gateway.db"
    proc, url, key = start_gateway(tiny_manifest, tmp_path)
    try:

        def call(i: int) -> httpx.Response | None:
            body = {"model": MODEL, "prompt": f"def f{i}(", "max_tokens": 40, "temperature": 0}
            try:
                return httpx.post(
                    f"{url}/v1/completions",
                    json=body,
                    timeout=120,
                    headers={"authorization": f"Bearer {key}"},
                )
            except httpx.HTTPError:
                return None

        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(call, i) for i in range(6)]
            time.sleep(1.0)
            proc.send_signal(signal.SIGTERM)  # graceful: in-flight requests finish
            responses = [f.result() for f in futures]
        assert proc.wait(timeout=120) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
    finally:
        if proc.poll() is None:
            proc.kill()
    served = {
        r.headers["x-request-id"] for r in responses if r is not None and r.status_code == 200
    }
    assert served, "no request finished before shutdown"

    async def stored() -> set[str]:
        store = await Database.connect(db)
        rows, _ = await store.records(RecordFilter(tenant_id="real"), limit=100)
        check = await store.verify()
        await store.close()
        assert check["ok"] is True
        return {str(r["request_id"]) for r in rows}

    assert served <= asyncio.run(stored())


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
