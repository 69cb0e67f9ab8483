"""Traffic split: which draft version serves this request during a rollout.

The bucket of a key is ``sha256(rollout.id + ":" + key) mod 10000``; the canary arm takes
buckets below ``canary_percent * 100``. The key is the tenant id for sticky rollouts (a
tenant always sees one version) and the request id otherwise. Hashing with the rollout id
gives each rollout an independent split, and the same inputs always give the same answer.

The split only picks between the two arms. Whether to speculate at all stays the policy
engine's call; a tenant whose policy does not allow the canary version gets the baseline.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from typing import TypeAlias

from models_registry.rollout import Rollout, RolloutState

BUCKETS = 10_000

TenantAllows: TypeAlias = Callable[[str], bool] | Collection[str] | None
"""A predicate over draft versions, the collection of versions the tenant's policy allows,
or None for "no restriction"."""


def bucket(rollout_id: str, key: str) -> int:
    """Stable bucket in [0, 10000) for ``key`` within this rollout."""
    digest = hashlib.sha256(f"{rollout_id}:{key}".encode()).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def allows(tenant_allows: TenantAllows, version: str) -> bool:
    if tenant_allows is None:
        return True
    if callable(tenant_allows):
        return bool(tenant_allows(version))
    return version in tenant_allows


def in_canary(rollout: Rollout, request_id: str, tenant_id: str) -> bool:
    """Whether the key falls in the canary's share (ignores state and tenant policy)."""
    key = tenant_id if rollout.sticky else request_id
    return bucket(rollout.id, key) < round(rollout.canary_percent * 100)


def choose_version(
    rollout: Rollout,
    request_id: str,
    tenant_id: str,
    tenant_allows: TenantAllows = None,
) -> str | None:
    """The draft version for this request; None when the baseline is "no draft".

    promoted -> the new version; rolled_back / paused -> the baseline; canary -> the new
    version for keys in the canary share whose tenant allows it, the baseline otherwise.
    """
    if rollout.state is RolloutState.PROMOTED:
        return rollout.version
    if rollout.state is not RolloutState.CANARY:
        return rollout.baseline_version
    if in_canary(rollout, request_id, tenant_id) and allows(tenant_allows, rollout.version):
        return rollout.version
    return rollout.baseline_version
