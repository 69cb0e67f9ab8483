"""Rollout state and API-registered versions live in the database: a restart keeps both."""

from __future__ import annotations

from pathlib import Path

from tests.integration.rollouts.conftest import (
    DRAFT,
    TARGET,
    admin,
    copy_draft,
    speculative,
    sqlite_url,
    start,
)
from tests.integration.service.harness import running_gateway


def anyone(_: str) -> bool:
    return True


async def test_restart_mid_rollout_keeps_state_split_and_registered_versions(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    url, ids = sqlite_url(tmp_path), [f"req-{i}" for i in range(500)]
    new_dir = copy_draft(tiny_manifest, tmp_path / "draft-v4")
    async with running_gateway(tiny_manifest, url, tmp_path) as gw:
        body = {
            "name": DRAFT,
            "version": "4",
            "role": "draft",
            "target": TARGET,
            "path": str(new_dir),
        }
        assert (await admin(gw, "POST", "/admin/models", body)).status_code == 201
        ro = await start(gw, "4", 50, guard={"min_samples": 500})
        before = [gw.services.traffic.choose(TARGET, i, "t", anyone) for i in ids]
        assert set(before) == {"1", "4"}

    async with running_gateway(tiny_manifest, url, tmp_path, tenant="tenant-b") as gw:
        svc = gw.services.traffic
        assert "4" in gw.services.pool.draft_versions(TARGET)  # manifest rebuilt from the DB
        models = {
            (m["name"], m["version"]): m["status"]
            for m in (await admin(gw, "GET", "/admin/models")).json()["data"]
        }
        assert models[(DRAFT, "4")] == "canary"
        view = (await admin(gw, "GET", f"/admin/rollouts/{ro['id']}")).json()
        assert view["state"] == "canary" and view["canary_percent"] == 50
        assert view["guard"]["min_samples"] == 500 and view["baseline_version"] == "1"
        assert [svc.choose(TARGET, i, "t", anyone) for i in ids] == before
        served: set[str] = set()  # both arms serve again (the canary loads from its DB row)
        for n in range(20):
            served.add((await speculative(gw, f"def f{n}():")).headers["x-draft-model"])
            if len(served) == 2:
                break
        assert served == {f"{DRAFT}@1", f"{DRAFT}@4"}, served
