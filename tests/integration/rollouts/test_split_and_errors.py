"""Traffic split through RolloutTraffic.choose, and the admin API's error answers."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.integration.rollouts.conftest import DRAFT, TARGET, admin, sqlite_url, start
from tests.integration.service.harness import ADMIN, Gateway, running_gateway
from tests.pg import fresh_database


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def gw(
    request: pytest.FixtureRequest, tiny_manifest: Path, tmp_path: Path
) -> AsyncIterator[Gateway]:
    """No decoding here, so these run on both databases."""
    if request.param == "sqlite":
        async with running_gateway(tiny_manifest, sqlite_url(tmp_path), tmp_path) as g:
            yield g
    else:
        async with fresh_database("ro") as url, running_gateway(tiny_manifest, url, tmp_path) as g:
            yield g


def anyone(_: str) -> bool:
    return True


async def test_split_is_proportional_deterministic_and_respects_tenant_policy(gw: Gateway) -> None:
    svc = gw.services.traffic
    assert svc.choose(TARGET, "r", "t", anyone) is None  # no rollout: the policy decides
    r = await start(gw, "2", 30)
    assert (r["state"], r["version"], r["baseline_version"]) == ("canary", "2", "1")
    ids = [f"req-{i}" for i in range(2000)]
    picks = [svc.choose(TARGET, i, "tenant-a", anyone) for i in ids]
    counts = Counter(picks)
    assert set(counts) == {"1", "2"}
    assert abs(counts["2"] / len(ids) - 0.30) <= 0.04, counts
    assert picks == [svc.choose(TARGET, i, "tenant-b", anyone) for i in ids]  # by request id
    only_v1 = [svc.choose(TARGET, i, "t", lambda v: v == "1") for i in ids]
    assert set(only_v1) == {"1"}  # a tenant whose policy refuses the canary stays on baseline
    assert svc.choose("other-target", "req-1", "t", anyone) is None

    r = await admin(gw, "POST", f"/admin/rollouts/{r['id']}/pause")
    assert r.status_code == 200 and r.json()["state"] == "paused", r.text
    assert {svc.choose(TARGET, i, "t", anyone) for i in ids[:200]} == {"1"}
    r = await admin(gw, "POST", f"/admin/rollouts/{r.json()['id']}/rollback")
    assert r.status_code == 200 and r.json()["state"] == "rolled_back", r.text
    assert (DRAFT, "2") not in gw.services.pool.loaded_drafts()  # canary weights unloaded

    sticky = await start(gw, "2", 50, sticky=True)
    assert sticky["sticky"] is True and sticky["id"] != r.json()["id"]
    per_tenant = {
        t: {svc.choose(TARGET, f"{t}-{i}", t, anyone) for i in range(20)} for t in range(100)
    }
    assert all(len(v) == 1 for v in per_tenant.values())  # a tenant sees one version
    share = sum(v == {"2"} for v in per_tenant.values()) / len(per_tenant)
    assert 0.3 < share < 0.7, share


async def test_errors_name_the_problem(gw: Gateway) -> None:
    for rid in ("999", "abc"):
        r = await admin(gw, "GET", f"/admin/rollouts/{rid}")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert (await admin(gw, "POST", f"/admin/rollouts/{rid}/promote")).status_code == 404
    base = {"target": TARGET, "draft": DRAFT, "version": "2", "canary_percent": 10}
    bad = [
        ({k: v for k, v in base.items() if k != "canary_percent"}, "canary_percent"),
        ({**base, "canary_percent": 150}, "canary_percent"),
        ({**base, "colour": "red"}, "colour"),
        ({**base, "guard": {"min_samples": 0}}, "min_samples"),
        ({**base, "guard": {"nope": 1}}, "nope"),
        ({**base, "sticky": "yes"}, "sticky"),
        ({**base, "version": ""}, "version"),
    ]
    for body, word in bad:
        r = await admin(gw, "POST", "/admin/rollouts", body)
        assert r.status_code == 400, (body, r.text)
        assert word in r.json()["error"]["message"], r.text
    r = await gw.client.post(
        "/admin/rollouts",
        content=b"{not json",
        headers={**ADMIN, "content-type": "application/json"},
    )
    assert r.status_code == 400
    r = await admin(gw, "POST", "/admin/rollouts", {**base, "version": "9"})
    assert r.status_code == 404 and "tiny-draft@9" in r.json()["error"]["message"]
    assert (await admin(gw, "GET", "/admin/rollouts")).json()["data"] == []  # nothing started

    first = await start(gw, "2", 10)
    r = await admin(gw, "POST", "/admin/rollouts", base)
    assert r.status_code == 409 and f"rollout {first['id']}" in r.json()["error"]["message"]
    r = await admin(gw, "POST", f"/admin/rollouts/{first['id']}/explode")
    assert r.status_code == 400
    assert (await admin(gw, "POST", f"/admin/rollouts/{first['id']}/rollback")).status_code == 200
    r = await admin(gw, "POST", f"/admin/rollouts/{first['id']}/promote")
    assert r.status_code == 409, r.text
    assert "cannot go from rolled_back to promoted" in r.json()["error"]["message"]
    r = await admin(gw, "POST", f"/admin/rollouts/{first['id']}/resume")
    assert r.status_code == 409
    rows = (await admin(gw, "GET", "/admin/rollouts")).json()["data"]
    assert [x["state"] for x in rows] == ["rolled_back"]

    reg = {"name": DRAFT, "version": "1", "role": "draft", "target": TARGET, "path": "/x"}
    r = await admin(gw, "POST", "/admin/models", reg)
    assert r.status_code == 409, r.text  # tiny-draft@1 is in the manifest
    r = await admin(gw, "POST", "/admin/models", {**reg, "version": "7", "path": "/nowhere"})
    assert r.status_code == 400 and "/nowhere" in r.json()["error"]["message"], r.text
    r = await admin(gw, "POST", "/admin/models", {**reg, "version": "7", "role": "critic"})
    assert r.status_code == 400 and "role" in r.json()["error"]["message"]
    r = await admin(gw, "POST", "/admin/models", {k: v for k, v in reg.items() if k != "path"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "path"
