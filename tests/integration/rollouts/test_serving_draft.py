"""One answer to "which draft serves now, and why": /admin/models names it (serving,
serving_reason) and the requests' x-draft-model and audit records agree, before a rollout
(the first registered version), during one (canary and baseline) and after a rollback."""

from __future__ import annotations

from tests.integration.rollouts.conftest import DRAFT, admin, speculative, start
from tests.integration.service.harness import Gateway


async def _serving(gw: Gateway) -> dict[str, tuple[str | None, str | None]]:
    r = await admin(gw, "GET", "/admin/models")
    assert r.status_code == 200, r.text
    drafts = [m for m in r.json()["data"] if m["role"] == "draft"]
    assert all("serving" in m for m in drafts)
    return {m["version"]: (m["serving"], m["serving_reason"]) for m in drafts}


async def test_the_models_list_names_the_draft_the_requests_are_served_with(gw: Gateway) -> None:
    before = await _serving(gw)
    assert before["1"][0] == "default" and "first registered" in (before["1"][1] or "")
    assert before["2"] == (None, None)
    served = {(await speculative(gw, p)).headers["x-draft-model"] for p in ("a", "b", "c")}
    assert served == {f"{DRAFT}@1"}
    records = [x for x in await gw.records() if x["draft_version"] is not None]
    assert {x["draft_version"] for x in records} == {"1"}

    rollout = await start(gw, "2", 50)
    during = await _serving(gw)
    assert during["2"][0] == "canary" and f"rollout {rollout['id']}" in (during["2"][1] or "")
    assert during["1"][0] == "baseline"
    versions = {(await speculative(gw, f"x{i}")).headers["x-draft-model"] for i in range(16)}
    assert versions == {f"{DRAFT}@1", f"{DRAFT}@2"}  # both arms, as the list says

    r = await admin(gw, "POST", f"/admin/rollouts/{rollout['id']}/rollback")
    assert r.status_code == 200, r.text
    after = await _serving(gw)
    assert after["1"][0] == "default" and after["2"] == (None, None)
