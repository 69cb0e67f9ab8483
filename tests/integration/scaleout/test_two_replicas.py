"""Two real gateway processes on one PostgreSQL database and the machine's Redis, started
at the same moment on an empty database: keys, policies and limits hold across both, a
canary judged from both replicas' traffic is rolled back once, and the audit chains verify.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import text

from gateway.database.base import make_engine
from tests.integration.scaleout.replicas import Replica, replicas
from tests.integration.service.harness import ADMIN, MODEL
from tests.pg import fresh_database
from tests.redis_util import redis_prefix_fixture, redis_url

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
redis_prefix = redis_prefix_fixture(scope="module")
SPEC = {"mode": "speculative", "proposer": "draft"}
GUARD = {"min_samples": 3, "window": 20, "max_acceptance_drop": 0.1, "max_latency_regression": 100}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pg_url() -> AsyncIterator[str]:
    async with fresh_database("scale") as url:
        yield url


@pytest.fixture(scope="module")
def pair(
    tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory, pg_url: str, redis_prefix: str
) -> Iterator[list[Replica]]:
    var = tmp_path_factory.mktemp("replicas")
    with replicas(
        2, tiny_manifest, var, pg_url, redis_url=redis_url(), redis_prefix=redis_prefix
    ) as started:
        yield started


async def admin(client: httpx.AsyncClient, method: str, url: str, body: Any = None) -> Any:
    r = await client.request(method, url, json=body, headers=ADMIN)
    assert r.status_code < 300, r.text
    return r.json()


async def tenant_key(a: Replica, tenant: str) -> str:
    async with httpx.AsyncClient(base_url=a.url, timeout=60) as c:
        await admin(c, "POST", "/admin/tenants", {"id": tenant, "name": tenant})
        return str((await admin(c, "POST", f"/admin/tenants/{tenant}/keys", {}))["key"])


def complete(key: str, prompt: str = "def add(a, b):", **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra}
    return {"json": body, "headers": {"authorization": f"Bearer {key}"}}


async def wait_policy(replica: Replica, tenant: str, timeout: float = 5.0) -> float:
    """Seconds until `tenant`'s document is in force on `replica` (fails after timeout)."""
    t0 = time.monotonic()
    async with httpx.AsyncClient(base_url=replica.url, timeout=10) as c:
        while time.monotonic() - t0 < timeout:
            bundle = (await admin(c, "GET", "/admin/policies"))["bundle"]
            if tenant in bundle["tenants"]:
                return time.monotonic() - t0
            await asyncio.sleep(0.1)
    raise AssertionError(f"{tenant}'s policy not in force on {replica.url} after {timeout}s")


async def test_both_came_up_on_one_migrated_database(pair: list[Replica], pg_url: str) -> None:
    engine = make_engine(pg_url)
    try:
        async with engine.connect() as conn:
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
    finally:
        await engine.dispose()
    assert [v for (v,) in version] == ["0007_reasoning_tokens"]
    for r in pair:
        assert httpx.get(f"{r.url}/ready").json()["ready"] is True


async def test_a_key_made_on_one_works_on_the_other(pair: list[Replica]) -> None:
    a, b = pair
    key = await tenant_key(a, "keys")
    async with httpx.AsyncClient(timeout=120) as c:
        r = await c.post(f"{b.url}/v1/completions", **complete(key))
        assert r.status_code == 200, r.text
        # an operator made on b acts on a, and the event names it
        op = await admin(c, "POST", f"{b.url}/admin/operators", {"name": "ops", "role": "admin"})
        r = await c.post(
            f"{a.url}/admin/tenants",
            json={"id": "by-ops", "name": "x"},
            headers={"authorization": f"Bearer {op['key']['key']}"},
        )
        assert r.status_code == 201, r.text
        revoked = await admin(c, "GET", f"{a.url}/admin/keys?tenant=keys")
        await admin(c, "DELETE", f"{a.url}/admin/keys/{revoked['data'][0]['id']}")
        r = await c.post(f"{b.url}/v1/completions", **complete(key))
        assert r.status_code == 401, r.text  # revoked on a: refused on b at once
        events = (await admin(c, "GET", f"{b.url}/audit/events?limit=1000"))["data"]
        assert any(e["action"] == "tenant.created" and e["actor"] == "ops" for e in events)


async def test_a_policy_put_on_one_is_in_force_on_the_other_within_5s(
    pair: list[Replica],
) -> None:
    a, b = pair
    key = await tenant_key(a, "pol")
    async with httpx.AsyncClient(timeout=120) as c:
        doc = {"rate_limits": {"requests_per_minute": 777}}
        await admin(c, "PUT", f"{a.url}/admin/policies/tenants/pol", doc)
        waited = await wait_policy(b, "pol")
        r = await c.post(f"{b.url}/v1/completions", **complete(key))
        assert r.status_code == 200, r.text
        assert r.headers["x-ratelimit-limit-requests"] == "777"
    assert waited < 5.0


async def test_a_tenant_limit_holds_across_both_under_a_burst(pair: list[Replica]) -> None:
    a, b = pair
    limit, burst = 5, 16
    key = await tenant_key(b, "burst")
    async with httpx.AsyncClient(timeout=300) as c:
        doc = {"rate_limits": {"requests_per_minute": limit}}
        await admin(c, "PUT", f"{b.url}/admin/policies/tenants/burst", doc)
        await wait_policy(a, "burst")
        calls = [
            c.post(f"{(a, b)[i % 2].url}/v1/completions", **complete(key, f"x = {i}"))
            for i in range(burst)
        ]
        answers = await asyncio.gather(*calls)
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * limit + [429] * (burst - limit), codes
    served_by = {(a, b)[i % 2].url for i, r in enumerate(answers) if r.status_code == 200}
    refused = [r for r in answers if r.status_code == 429]
    assert all(r.json()["error"]["code"] == "rate_limit_exceeded" for r in refused)
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert served_by, "nothing served"


async def test_a_canary_judged_from_both_replicas_is_rolled_back_once(
    pair: list[Replica], pg_url: str
) -> None:
    a, b = pair
    key = await tenant_key(a, "canary")
    async with httpx.AsyncClient(timeout=300) as c:
        body = {"target": MODEL, "draft": "tiny-draft", "version": "2", "canary_percent": 50}
        ro = await admin(c, "POST", f"{a.url}/admin/rollouts", {**body, "guard": GUARD})
        rid = ro["id"]
        # b learns of the rollout from the database (its sync loop) before traffic starts
        for _ in range(60):
            view = await admin(c, "GET", f"{b.url}/admin/rollouts/{rid}")
            if view["state"] == "canary":
                break
            await asyncio.sleep(0.1)
        state = "canary"
        for i in range(40):  # concurrent traffic on both replicas
            answers = await asyncio.gather(
                *(
                    c.post(
                        f"{r.url}/v1/completions",
                        **complete(key, f"def f{i}{j}():", decoding=SPEC, max_tokens=16),
                    )
                    for j, r in enumerate(pair)
                )
            )
            assert all(x.status_code == 200 for x in answers), [x.text for x in answers]
            state = (await admin(c, "GET", f"{b.url}/admin/rollouts/{rid}"))["state"]
            if state == "rolled_back":
                break
        assert state == "rolled_back", "the guard never tripped"
        await asyncio.sleep(1.0)  # let both replicas' pending judgements finish
        views = [await admin(c, "GET", f"{r.url}/admin/rollouts/{rid}") for r in pair]
        assert [v["state"] for v in views] == ["rolled_back", "rolled_back"]
        assert views[0]["canary"] == views[1]["canary"]  # the same pooled stats from both
        assert views[0]["baseline"] == views[1]["baseline"]
        events = (await admin(c, "GET", f"{a.url}/audit/events?limit=1000"))["data"]
        rollbacks = [e for e in events if e["action"] == "rollout.rolled_back"]
        assert len(rollbacks) == 1 and rollbacks[0]["actor"] == "guard"
        assert rollbacks[0]["subject"] == f"rollout:{rid}"
    engine = make_engine(pg_url)
    try:
        async with engine.connect() as conn:
            q = "SELECT count(DISTINCT replica) FROM rollout_samples WHERE rollout_id = :id"
            replicas_seen = (await conn.execute(text(q), {"id": int(rid)})).scalar_one()
    finally:
        await engine.dispose()
    assert replicas_seen == 2  # the guard's window held both replicas' samples


async def test_a_version_registered_and_rolled_out_on_one_serves_on_the_other(
    pair: list[Replica], tiny_manifest: Path, tmp_path: Path
) -> None:
    a, b = pair
    key = await tenant_key(a, "versions")
    path = shutil.copytree(tiny_manifest.parent / "tiny-draft-v1", tmp_path / "tiny-draft-v5")
    async with httpx.AsyncClient(timeout=300) as c:
        body = {"name": "tiny-draft", "version": "5", "role": "draft", "target": MODEL}
        await admin(c, "POST", f"{a.url}/admin/models", {**body, "path": str(path)})
        start = {"target": MODEL, "draft": "tiny-draft", "version": "5", "canary_percent": 100}
        ro = await admin(c, "POST", f"{a.url}/admin/rollouts", start)
        t0, served = time.monotonic(), None
        while time.monotonic() - t0 < 5.0:
            r = await c.post(
                f"{b.url}/v1/completions",
                **complete(key, "def g():", decoding=SPEC, max_tokens=16),
            )
            assert r.status_code == 200, r.text
            served = r.headers.get("x-draft-model")
            if served == "tiny-draft@5":
                break
            await asyncio.sleep(0.2)
        assert served == "tiny-draft@5", f"b still serves {served} after 5 s"
        await admin(c, "POST", f"{b.url}/admin/rollouts/{ro['id']}/rollback")


async def test_the_chains_verify_after_everything(pair: list[Replica]) -> None:
    key = await tenant_key(pair[0], "chain")
    async with httpx.AsyncClient(timeout=300) as c:
        answers = await asyncio.gather(
            *(
                c.post(f"{pair[i % 2].url}/v1/completions", **complete(key, f"y = {i}"))
                for i in range(8)
            )
        )
        assert all(r.status_code == 200 for r in answers)
        reports = [await admin(c, "GET", f"{r.url}/audit/verify") for r in pair]
    assert reports[0] == reports[1]
    assert reports[0]["ok"] is True and reports[0]["checked"] >= 8
    assert reports[0]["admin_events"]["ok"] is True
