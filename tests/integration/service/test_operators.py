"""Named operators: roles decide what a key may do, every admin event names the principal,
keys expire (401), rotate (the old key works until its grace ends) and are listed without
their secrets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.integration.service.harness import ADMIN, Gateway, sqlite_gateway


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def operator(g: Gateway, name: str, role: str, **extra: Any) -> str:
    r = await g.client.post(
        "/admin/operators", json={"name": name, "role": role, **extra}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    assert r.json()["role"] == role and r.json()["key"]["key"].startswith("sk-")
    return str(r.json()["key"]["key"])


async def events(g: Gateway) -> list[dict[str, Any]]:
    r = await g.client.get("/audit/events", params={"limit": 1000}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()["data"]  # type: ignore[no-any-return]


def assert_openai_error(r: Any, status: int, code: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code


POLICY = {"speculation": {"k": {"min": 1, "max": 3}}}


async def test_roles_decide_and_events_name_the_principal(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path) as g:
        alice = await operator(g, "alice", "policy-author")
        bob = await operator(g, "bob", "rollout-operator")
        carol = await operator(g, "carol", "auditor")
        root = await operator(g, "root", "admin")

        # a rollout-operator cannot change policies; a policy author can
        r = await g.client.put(
            f"/admin/policies/tenants/{g.tenant}", json=POLICY, headers=bearer(bob)
        )
        assert_openai_error(r, 403, "forbidden")
        assert "rollout-operator" in r.json()["error"]["message"]
        r = await g.client.put(
            f"/admin/policies/tenants/{g.tenant}", json=POLICY, headers=bearer(alice)
        )
        assert r.status_code == 200, r.text
        # bob reads rollouts and policies; alice cannot touch rollouts or tenants
        assert (await g.client.get("/admin/rollouts", headers=bearer(bob))).status_code == 200
        assert (await g.client.get("/admin/policies", headers=bearer(bob))).status_code == 200
        r = await g.client.post("/admin/rollouts/1/rollback", headers=bearer(alice))
        assert_openai_error(r, 403)
        r = await g.client.post(
            "/admin/tenants", json={"id": "x", "name": "x"}, headers=bearer(alice)
        )
        assert_openai_error(r, 403)
        # the auditor reads every tenant's records and the admin events, changes nothing
        assert (await g.client.get("/audit/events", headers=bearer(carol))).status_code == 200
        r = await g.client.get("/audit/records", params={"tenant": g.tenant}, headers=bearer(carol))
        assert r.status_code == 200, r.text
        r = await g.client.put(
            f"/admin/policies/tenants/{g.tenant}", json=POLICY, headers=bearer(carol)
        )
        assert_openai_error(r, 403)
        # only admins manage operators; an admin operator acts under its own name
        r = await g.client.post(
            "/admin/operators", json={"name": "eve", "role": "admin"}, headers=bearer(alice)
        )
        assert_openai_error(r, 403)
        r = await g.client.post(
            "/admin/tenants", json={"id": "t2", "name": "T2"}, headers=bearer(root)
        )
        assert r.status_code == 201, r.text
        # a tenant key is not an operator
        r = await g.client.get("/admin/tenants", headers=g.auth)
        assert_openai_error(r, 403)

        seen = {(e["action"], e["subject"]): e["actor"] for e in await events(g)}
        assert seen[("policy.activated", g.tenant)] == "alice"
        assert seen[("tenant.created", "t2")] == "root"
        assert seen[("principal.created", "principal:alice")] == "admin"  # the bootstrap key
        assert seen[("tenant.created", g.tenant)] == "admin"

        # names are validated, reserved names refused, duplicates conflict
        for name, status in (("Alice!", 400), ("guard", 400), ("alice", 409)):
            r = await g.client.post(
                "/admin/operators", json={"name": name, "role": "auditor"}, headers=ADMIN
            )
            assert_openai_error(r, status)


async def test_expiry_rotation_listing_and_disable(tiny_manifest: Path, tmp_path: Path) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path) as g:
        short = await operator(g, "short", "rollout-operator", expires_in_s=1)
        assert (await g.client.get("/admin/rollouts", headers=bearer(short))).status_code == 200
        await asyncio.sleep(1.2)
        r = await g.client.get("/admin/rollouts", headers=bearer(short))
        assert_openai_error(r, 401, "expired_api_key")

        old = await operator(g, "ci", "rollout-operator")
        listed = (await g.client.get("/admin/operators", headers=ADMIN)).json()["data"]
        ci = next(o for o in listed if o["name"] == "ci")
        (old_key,) = ci["keys"]
        assert old_key["last_used_at"] is None and old_key["expires_at"] is None
        assert (await g.client.get("/admin/models", headers=bearer(old))).status_code == 200
        # the operator rotates its own key with a 2 s grace period
        r = await g.client.post(
            f"/admin/keys/{old_key['id']}/rotate", json={"grace_s": 2}, headers=bearer(old)
        )
        assert r.status_code == 201, r.text
        new = r.json()["key"]
        assert r.json()["replaces"]["id"] == old_key["id"]
        assert (await g.client.get("/admin/models", headers=bearer(old))).status_code == 200
        assert (await g.client.get("/admin/models", headers=bearer(new))).status_code == 200
        await asyncio.sleep(2.2)
        assert_openai_error(await g.client.get("/admin/models", headers=bearer(old)), 401)
        assert (await g.client.get("/admin/models", headers=bearer(new))).status_code == 200
        # another operator's key: only an admin may rotate it
        other = await operator(g, "other", "policy-author")
        r = await g.client.post(
            f"/admin/keys/{old_key['id']}/rotate", json={}, headers=bearer(other)
        )
        assert_openai_error(r, 403)

        r = await g.client.get("/admin/keys", headers=ADMIN)
        assert r.status_code == 200, r.text
        keys = {k["id"]: k for k in r.json()["data"]}
        assert keys[old_key["id"]]["last_used_at"] is not None
        assert keys[old_key["id"]]["expires_at"] is not None
        assert all("hash" not in str(k) and "key" not in k for k in keys.values())
        assert old not in r.text and new not in r.text
        names = {e["action"] for e in await events(g)}
        assert {"key.rotated", "key.expiry_set", "principal.created"} <= names

        r = await g.client.delete("/admin/operators/ci", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert_openai_error(await g.client.get("/admin/models", headers=bearer(new)), 401)
        r = await g.client.delete("/admin/operators/ci", headers=ADMIN)
        assert_openai_error(r, 404, "operator_not_found")
