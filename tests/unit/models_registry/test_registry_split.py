from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from models_registry.rollout import ProposedRollout, Rollout, RolloutState, start_rollout
from models_registry.split import bucket, choose_version, in_canary


def rollout(percent: float = 10.0, sticky: bool = False, **kw: object) -> Rollout:
    proposed = ProposedRollout(
        target="t",
        draft="d",
        version="2",
        baseline_version="1",
        canary_percent=percent,
        sticky=sticky,
    )
    r = start_rollout("ro-42", proposed)
    return Rollout(**{**r.__dict__, **kw})


def test_bucket_formula_is_pinned() -> None:
    digest = hashlib.sha256(b"ro-42:req-7").digest()
    assert bucket("ro-42", "req-7") == int.from_bytes(digest, "big") % 10000


@pytest.mark.parametrize("percent", [1.0, 10.0, 25.0, 50.0, 90.0])
def test_request_split_proportion(percent: float) -> None:
    r = rollout(percent)
    counts = Counter(choose_version(r, f"req-{i}", "acme") for i in range(10_000))
    share = counts["2"] / 10_000
    assert abs(share - percent / 100) <= 0.015
    assert counts["2"] + counts["1"] == 10_000


def test_zero_and_hundred_percent_are_exact() -> None:
    assert {choose_version(rollout(0.0), f"r{i}", "a") for i in range(2000)} == {"1"}
    assert {choose_version(rollout(100.0), f"r{i}", "a") for i in range(2000)} == {"2"}


def test_deterministic_and_independent_per_rollout() -> None:
    r = rollout(50.0)
    first = [choose_version(r, f"req-{i}", "acme") for i in range(500)]
    assert first == [choose_version(r, f"req-{i}", "acme") for i in range(500)]
    other = Rollout(**{**r.__dict__, "id": "ro-43"})
    assert first != [choose_version(other, f"req-{i}", "acme") for i in range(500)]


def test_sticky_is_per_tenant() -> None:
    r = rollout(30.0, sticky=True)
    per_tenant = {}
    for t in range(3000):
        versions = {choose_version(r, f"req-{t}-{i}", f"tenant-{t}") for i in range(5)}
        assert len(versions) == 1  # every request of a tenant sees one version
        per_tenant[t] = versions.pop()
    share = sum(v == "2" for v in per_tenant.values()) / len(per_tenant)
    assert abs(share - 0.30) <= 0.03
    # not sticky: one tenant's requests spread across both versions
    loose = rollout(30.0)
    assert {choose_version(loose, f"req-{i}", "tenant-1") for i in range(200)} == {"1", "2"}


def test_tenant_not_allowing_canary_gets_baseline() -> None:
    r = rollout(100.0)
    for allowed in (lambda v: v != "2", {"1"}, ["1", "3"], frozenset()):
        assert {choose_version(r, f"q{i}", "bank", allowed) for i in range(300)} == {"1"}
    assert choose_version(r, "q1", "bank", lambda v: v == "2") == "2"
    assert choose_version(r, "q1", "bank", {"1", "2"}) == "2"


def test_policy_filter_only_removes_canary_traffic() -> None:
    r = rollout(40.0)
    ids = [f"req-{i}" for i in range(2000)]
    canary = {i for i in ids if in_canary(r, i, "x")}
    allowed = {i for i in ids if choose_version(r, i, "x", {"1", "2"}) == "2"}
    assert allowed == canary


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (RolloutState.PROMOTED, "2"),
        (RolloutState.PAUSED, "1"),
        (RolloutState.ROLLED_BACK, "1"),
    ],
)
def test_state_overrides_split(state: RolloutState, expected: str) -> None:
    for percent in (0.0, 100.0):
        r = rollout(percent, state=state)
        assert {choose_version(r, f"q{i}", "t") for i in range(200)} == {expected}


def test_no_draft_baseline_is_none() -> None:
    r = Rollout(**{**rollout(0.0).__dict__, "baseline_version": None})
    assert choose_version(r, "q", "t") is None
