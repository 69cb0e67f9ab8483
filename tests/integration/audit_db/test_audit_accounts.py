"""Tenants, keys, policies, acceptance history, models and rollouts (simple CRUD)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from gateway.database import Database, KeyInfo, TenantExists
from gateway.database.rollouts import NewModelVersion, NewRollout


async def test_tenants(store: Database) -> None:
    created = await store.create_tenant("acme", "Acme Corp", actor="ops")
    assert created["id"] == "acme"
    with pytest.raises(TenantExists):
        await store.create_tenant("acme", "Again")
    await store.create_tenant("beta", "Beta")
    assert [t["id"] for t in await store.list_tenants()] == ["acme", "beta"]
    assert (await store.get_tenant("acme"))["name"] == "Acme Corp"  # type: ignore[index]
    assert await store.get_tenant("nope") is None
    events, _ = await store.events()
    assert [(e["action"], e["subject"]) for e in events] == [("tenant.created", "acme")]


async def test_keys_store_only_the_hash_and_revoke(store: Database) -> None:
    await store.create_tenant("acme", "Acme")
    key_id, plaintext = await store.create_key("acme", "tenant", actor="ops")
    auditor_id, auditor_secret = await store.create_key(None, "auditor")
    assert plaintext.startswith("sk-") and len(plaintext) > 30
    async with store.engine.connect() as conn:
        dump = repr((await conn.execute(text("SELECT * FROM api_keys"))).all())
    assert plaintext not in dump and plaintext[10:] not in dump and auditor_secret not in dump
    assert await store.lookup_key(plaintext) == KeyInfo(key_id, "acme", "tenant", False)
    assert await store.lookup_key(auditor_secret) == KeyInfo(auditor_id, None, "auditor", False)
    assert await store.lookup_key(plaintext + "x") is None
    assert await store.revoke_key(key_id, actor="ops") is True
    assert await store.revoke_key(key_id) is False
    assert await store.revoke_key("key_missing") is False
    assert (await store.lookup_key(plaintext)).revoked is True  # type: ignore[union-attr]
    listed = await store.list_keys("acme")
    assert [k["id"] for k in listed] == [key_id] and "key_hash" not in listed[0]
    with pytest.raises(ValueError):
        await store.create_key("acme", "root")
    with pytest.raises(LookupError):
        await store.create_key("ghost", "tenant")
    actions = [e["action"] for e in (await store.events())[0]]
    assert actions == ["key.revoked", "key.created"]
    assert (await store.verify())["admin_events"]["ok"]


async def test_policies_are_versioned_per_tenant(store: Database) -> None:
    first = await store.put_policy("*", {"rules": [1]}, actor="ops")
    second = await store.put_policy("*", {"rules": [2]}, revision="rev-2", actor="ops")
    await store.put_policy("acme", {"rules": []})
    assert (first["version"], second["version"]) == (1, 2)
    active = await store.active_policy("*")
    assert active is not None and active["document"] == {"rules": [2]}
    assert active["revision"] == "rev-2"
    assert await store.active_policy("ghost") is None
    assert [p["version"] for p in await store.list_policies("*")] == [2, 1]
    events, _ = await store.events(action="policy.activated")
    assert events[0]["before"] == {"version": 1, "revision": first["revision"]}
    assert events[0]["after"] == {"version": 2, "revision": "rev-2"}


async def test_acceptance_history_upserts(store: Database) -> None:
    await store.put_acceptance("*", "draft", "1", ewma_acceptance=0.5, ewma_c=0.1, samples=3)
    await store.put_acceptance("*", "draft", "1", ewma_acceptance=0.6, ewma_c=0.2, samples=4)
    await store.put_acceptance(
        "acme", "prompt_lookup", "", ewma_acceptance=0.3, ewma_c=0.0, samples=1
    )
    row = await store.get_acceptance("*", "draft", "1")
    assert row is not None and (row["ewma_acceptance"], row["samples"]) == (0.6, 4)
    assert len(await store.list_acceptance()) == 2
    assert [r["proposer"] for r in await store.list_acceptance("acme")] == ["prompt_lookup"]
    assert await store.get_acceptance("acme", "draft", "1") is None
    # a request's tenant and global rows, upserted in one transaction
    await store.put_acceptances(
        [("acme", "draft", "1", 0.7, 0.1, 5), ("*", "draft", "1", 0.65, 0.1, 9)]
    )
    rows = [r for r in await store.list_acceptance() if r["proposer"] == "draft"]
    got = {r["tenant_id"]: (r["ewma_acceptance"], r["samples"]) for r in rows}
    assert got == {"acme": (0.7, 5), "*": (0.65, 9)}


async def test_models_and_rollouts(store: Database) -> None:
    target = NewModelVersion(name="tgt", version="1", role="target", path="/m/t", sha256="a" * 64)
    draft = NewModelVersion(
        name="drf", version="2", role="draft", target="tgt", path="/m/d", sha256="b" * 64
    )
    await store.register_model(target, actor="ops")
    await store.register_model(draft)
    assert [m["name"] for m in await store.list_models(role="draft")] == ["drf"]
    assert await store.set_model_status("drf", "2", "active", actor="ops") is True
    assert await store.set_model_status("drf", "9", "active") is False
    assert (await store.get_model("drf", "2"))["status"] == "active"  # type: ignore[index]
    new = NewRollout(
        target="tgt",
        draft="drf",
        version="2",
        baseline_version="1",
        canary_percent=10,
        guard={"min_alpha": 0.4},
    )
    rollout = await store.create_rollout(new, actor="ops")
    updated = await store.update_rollout(
        rollout["id"], state="promoted", canary_percent=100, reason="guard passed", actor="ops"
    )
    assert updated is not None and updated["state"] == "promoted"
    stored = await store.get_rollout(rollout["id"])
    assert stored is not None and stored["canary_percent"] == 100.0 and stored["sticky"] is True
    assert stored["guard"] == {"min_alpha": 0.4} and stored["reason"] == "guard passed"
    assert await store.update_rollout(999, state="paused") is None
    with pytest.raises(ValueError):
        await store.update_rollout(rollout["id"], target="other")
    assert len(await store.list_rollouts(state="promoted")) == 1
    actions = [e["action"] for e in (await store.events())[0]]
    assert actions == [
        "rollout.promoted",
        "rollout.started",
        "model.status_changed",
        "model.registered",
    ]
    assert (await store.verify())["ok"]
