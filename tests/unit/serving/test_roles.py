"""What each operator role may do (gateway.serving.auth.ROLE_PERMISSIONS), and that tenant
keys, tenant-scoped auditor keys included, are never operators."""

from __future__ import annotations

from typing import get_args

import pytest

from gateway.serving.auth import ROLE_PERMISSIONS, Permission, allows
from gateway.serving.commands import Principal

EVERY = set(get_args(Permission))


def operator(role: str) -> Principal:
    return Principal(role=role, tenant_id=None, key_id="key_x", name="someone")  # type: ignore[arg-type]


def test_admin_may_do_everything_and_roles_are_exactly_these() -> None:
    assert set(ROLE_PERMISSIONS) == {"admin", "policy-author", "rollout-operator", "auditor"}
    assert all(allows(operator("admin"), p) for p in EVERY)


@pytest.mark.parametrize(
    ("role", "may", "may_not"),
    [
        ("policy-author", {"policies.write"}, {"rollouts.write", "tenants.write", "audit.read"}),
        ("rollout-operator", {"rollouts.write", "policies.read"}, {"policies.write", "audit.read"}),
        ("auditor", {"audit.read", "rollouts.read"}, {"policies.write", "rollouts.write"}),
    ],
)
def test_each_role_allows_its_work_only(role: str, may: set[str], may_not: set[str]) -> None:
    p = operator(role)
    assert all(allows(p, x) for x in may)  # type: ignore[arg-type]
    assert not any(allows(p, x) for x in may_not)  # type: ignore[arg-type]
    assert not any(allows(p, x) for x in ("operators.write", "operators.read"))


def test_tenant_keys_are_never_operators() -> None:
    tenant = Principal(role="tenant", tenant_id="acme", key_id="key_t")
    tenant_auditor = Principal(role="auditor", tenant_id="acme", key_id="key_a")
    assert not any(allows(tenant, p) for p in EVERY)
    assert not any(allows(tenant_auditor, p) for p in EVERY)  # its own records only
    assert tenant.actor == "key_t" and operator("auditor").actor == "someone"
