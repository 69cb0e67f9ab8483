"""A bad canary is rolled back by the guard; a good one passes the regression gate and is
promoted; every request's audit record names the draft version that served it."""

from __future__ import annotations

from pathlib import Path

from gateway.serving.rollouts import RolloutAdmin
from models_registry.regression import RegressionResult, gate, load_regression_set
from tests.integration.rollouts.conftest import (
    DRAFT,
    PROMPTS,
    TARGET,
    admin,
    copy_draft,
    events,
    speculative,
    start,
    swap_token_ids,
    wait_for_event,
)
from tests.integration.service.harness import Gateway

GUARD = {"min_samples": 3, "window": 20, "max_acceptance_drop": 0.1, "max_latency_regression": 100}


def version_of(response: object) -> str:
    return response.headers["x-draft-model"].removeprefix(f"{DRAFT}@")  # type: ignore[attr-defined]


async def test_guard_rolls_back_a_bad_draft_and_traffic_returns_to_baseline(gw: Gateway) -> None:
    r = await start(gw, "2", 50, guard=GUARD)  # v2: random weights; baseline v1 always agrees
    rid = r["id"]
    served: list[str] = []
    for i in range(60):
        resp = await speculative(gw, f"{PROMPTS[i % len(PROMPTS)]} # {i}")
        served.append(version_of(resp))
        if (await gw.services.rollouts.get(rid))["state"] == "rolled_back":
            break
    else:
        raise AssertionError(f"the guard never tripped: {served}")
    assert {"1", "2"} <= set(served)

    event = await wait_for_event(gw, "rollout.rolled_back", "guard")
    assert event["subject"] == f"rollout:{rid}"
    assert "acceptance dropped" in event["after"]["reason"]
    view = (await admin(gw, "GET", f"/admin/rollouts/{rid}")).json()
    assert view["state"] == "rolled_back" and view["reason"].startswith("guard: acceptance")
    assert view["baseline"]["acceptance"] > view["canary"]["acceptance"] + 0.1
    assert view["canary"]["requests"] >= 3 and view["baseline"]["requests"] >= 3
    assert view["canary"]["p50_ms"] > 0 and view["baseline"]["tokens_per_second"] > 0
    assert (DRAFT, "2") not in gw.services.pool.loaded_drafts()

    after = [version_of(await speculative(gw, f"{p} # after")) for p in PROMPTS]
    assert after == ["1"] * len(PROMPTS)
    records = {x["request_id"]: x for x in await gw.records()}
    assert {x["draft_version"] for x in records.values() if x["draft_model"]} == {"1", "2"}
    models = {
        (m["name"], m["version"]): m
        for m in (await admin(gw, "GET", "/admin/models")).json()["data"]
    }
    assert models[(DRAFT, "2")]["status"] == "registered"
    assert models[(DRAFT, "1")]["status"] == "active"


async def test_register_then_promote_a_good_draft(
    gw: Gateway, tiny_manifest: Path, tmp_path: Path, monkeypatch: object
) -> None:
    bad_dir = copy_draft(tiny_manifest, tmp_path / "draft-bad")
    a, b = swap_token_ids(bad_dir, 40, 41)
    body = {"name": DRAFT, "version": "3", "role": "draft", "target": TARGET, "path": str(bad_dir)}
    r = await admin(gw, "POST", "/admin/models", body)
    assert r.status_code == 400, r.text
    assert repr(a) in r.json()["error"]["message"] or repr(b) in r.json()["error"]["message"]

    good = copy_draft(tiny_manifest, tmp_path / "draft-v3")
    r = await admin(gw, "POST", "/admin/models", {**body, "path": str(good)})
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "registered" and len(r.json()["sha256"]) == 64
    assert "3" in gw.services.pool.draft_versions(TARGET)  # hot: no restart
    listed = (await admin(gw, "GET", "/admin/models")).json()["data"]
    assert {(m["version"], m["status"]) for m in listed if m["name"] == DRAFT} == {
        ("1", "active"),
        ("2", "active"),
        ("3", "registered"),
    }
    assert (await events(gw, "model.registered"))[0]["subject"] == f"{DRAFT}@3"

    ro = await start(gw, "3", 50, guard={"min_samples": 1000})
    assert ro["baseline_version"] == "1"
    for p in PROMPTS:
        await speculative(gw, p)
    ro_view = (await admin(gw, "GET", f"/admin/rollouts/{ro['id']}")).json()
    assert ro_view["canary"]["requests"] + ro_view["baseline"]["requests"] == len(PROMPTS)

    svc: RolloutAdmin = gw.services.rollouts
    real = svc.run_regression

    async def mismatching(target: str, draft: object) -> object:
        return gate([RegressionResult("fib", (5, 6, 7), (5, 6, 9))])

    svc.run_regression = mismatching  # type: ignore[method-assign]
    r = await admin(gw, "POST", f"/admin/rollouts/{ro['id']}/promote")
    svc.run_regression = real  # type: ignore[method-assign]
    assert r.status_code == 409, r.text
    msg = r.json()["error"]["message"]
    assert "prompt 'fib'" in msg and "token 2" in msg
    assert (await admin(gw, "GET", f"/admin/rollouts/{ro['id']}")).json()["state"] == "canary"

    r = await admin(gw, "POST", f"/admin/rollouts/{ro['id']}/promote")
    assert r.status_code == 200, r.text
    promoted = r.json()
    assert promoted["state"] == "promoted"
    assert promoted["gate"]["passed"] is True
    assert promoted["gate"]["checked"] == len(load_regression_set())
    assert (DRAFT, "3") in gw.services.pool.loaded_drafts()
    assert gw.services.traffic.choose(TARGET, "any", "t", lambda v: True) == "3"

    later = [await speculative(gw, f"{p} # later") for p in PROMPTS]
    assert {version_of(x) for x in later} == {"3"}
    records = {x["request_id"]: x for x in await gw.records()}
    for resp in later:
        assert records[resp.headers["x-request-id"]]["draft_version"] == "3"
    models = {
        (m["name"], m["version"]): m["status"]
        for m in (await admin(gw, "GET", "/admin/models")).json()["data"]
    }
    assert models[(DRAFT, "3")] == "active" and models[(DRAFT, "1")] == "retired"
    actions = [(e["action"], e["actor"]) for e in await events(gw, "rollout.")]
    assert actions[:3] == [
        ("rollout.promoted", "admin"),
        ("rollout.updated", "admin"),
        ("rollout.started", "admin"),
    ]
    r = await admin(gw, "POST", f"/admin/rollouts/{ro['id']}/promote")
    assert r.status_code == 409
