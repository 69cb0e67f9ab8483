"""Writes that several replicas make at once, each through its own connection pool, on
SQLite and PostgreSQL: policy versions stay a gapless sequence, a guard's compare-and-set
rollback happens once, and operator keys rotate and expire as stored."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from gateway.database import Database
from gateway.database.rollouts import NewRollout


async def _replicas(url: str, n: int = 2) -> list[Database]:
    return [await Database.connect(url) for _ in range(n)]


async def test_concurrent_policy_puts_number_versions_without_gaps(
    store: Database, db_url: str
) -> None:
    a, b = await _replicas(db_url)
    try:
        await asyncio.gather(
            *(
                (a, b)[i % 2].put_policy("acme", {"mode": "auto", "n": i}, actor=f"op{i % 2}")
                for i in range(12)
            )
        )
    finally:
        await a.close()
        await b.close()
    versions = sorted(r["version"] for r in await store.list_policies("acme"))
    assert versions == list(range(1, 13))
    (latest,) = [r for r in await store.latest_policies() if r["tenant_id"] == "acme"]
    assert latest["version"] == 12
    assert (await store.verify())["admin_events"]["ok"]


async def test_a_guard_rollback_raced_by_two_replicas_is_written_once(
    store: Database, db_url: str
) -> None:
    new = NewRollout(
        target="t",
        draft="d",
        version="2",
        baseline_version="1",
        canary_percent=50.0,
        sticky=False,
        guard={},
        state="canary",
        reason="",
    )
    row = await store.create_rollout(new, actor="alice")
    replicas = await _replicas(db_url, 4)
    try:
        results = await asyncio.gather(
            *(
                r.update_rollout(
                    row["id"],
                    actor="guard",
                    expect_state="canary",
                    state="rolled_back",
                    reason=f"guard: replica {i}",
                )
                for i, r in enumerate(replicas)
            )
        )
    finally:
        for r in replicas:
            await r.close()
    assert sum(x is not None for x in results) == 1
    events, _ = await store.events(None, None, None, 100)
    assert [e["actor"] for e in events if e["action"] == "rollout.rolled_back"] == ["guard"]
    assert (await store.get_rollout(row["id"]))["state"] == "rolled_back"


async def test_principal_keys_rotate_and_list_without_secrets(store: Database) -> None:
    row, key_id, secret = await store.create_principal("alice", "rollout-operator", actor="admin")
    assert row["role"] == "rollout-operator"
    info = await store.lookup_key(secret)
    assert info is not None and (info.principal, info.role) == ("alice", "rollout-operator")
    got = await store.rotate_key(key_id, timedelta(minutes=5), actor="alice")
    assert got is not None
    new_id, new_secret, old_end, new_end = got
    assert new_end is None  # the old key never expired: neither does its successor
    assert timedelta(minutes=4) < old_end - datetime.now(UTC) <= timedelta(minutes=5)
    old, new = await store.lookup_key(secret), await store.lookup_key(new_secret)
    assert old is not None and old.expires_at == old_end and not old.revoked
    assert new is not None and new.principal == "alice" and new.expires_at is None
    await store.touch_key(new_id, None)
    keys = {k["id"]: k for k in await store.list_keys(principal="alice")}
    assert set(keys) == {key_id, new_id} and keys[new_id]["last_used_at"] is not None
    assert all("key_hash" not in k for k in keys.values())
    assert await store.disable_principal("alice", actor="admin")
    assert (await store.lookup_key(new_secret)).revoked  # type: ignore[union-attr]
    assert await store.create_operator_key("alice", actor="admin") is None
    assert (await store.verify())["admin_events"]["ok"]
