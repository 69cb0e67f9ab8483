"""Row-driven decision checks shared by the decision tables (one row = tenant document +
request + context -> expected outcome), and invariants every Decision must satisfy."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from policy_helpers import bundle_with, context, history, request

from policies import Capabilities, Decision, decide

NO_DRAFTS = Capabilities(draft_versions=(), preferred_draft_version=None)
HIGH = history("draft", "2", 0.9, 0.1, 100)
LOW = history("draft", "2", 0.05, 0.1, 100)
# a = 0.18 -> S = 1.073 (k=1): inside the band [1.05, 1.10] of margin 0.1 +- hysteresis 0.05.
BAND_LOW = history("draft", "2", 0.18, 0.1, 100)
# a = 0.23 -> S = 1.118 (k=1): inside the band [1.10, 1.15].
BAND_HIGH = history("draft", "2", 0.23, 0.1, 100)


@dataclass(frozen=True)
class Row:
    name: str
    mode: str
    proposer: str | None = None
    version: str | None = None
    reasons: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()
    dryrun: tuple[str, ...] = ()
    tenant: dict[str, Any] | None = None
    req: dict[str, Any] = field(default_factory=dict)
    ctx: dict[str, Any] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)


def check_row(row: Row) -> Decision:
    bundle = bundle_with(row.tenant)
    decision = decide(bundle, context(request(**row.req), **row.ctx))

    assert decision.mode == row.mode
    if row.proposer is not None and row.mode == "speculative":
        assert decision.proposer == row.proposer
    if row.version is not None:
        assert decision.draft_version == row.version
    for reason in row.reasons:
        assert reason in decision.reason_codes, decision.reason_codes
    assert_in_order(row.reasons, decision.reason_codes)
    for rule in row.rules:
        assert rule in decision.rule_ids, decision.rule_ids
    assert decision.dryrun == row.dryrun
    for key, want in row.expect.items():
        got = decision.inputs[key.split(".", 1)[1]] if "." in key else getattr(decision, key)
        assert got == want, key
    assert_invariants(decision)
    return decision


def assert_in_order(expected: tuple[str, ...], got: tuple[str, ...]) -> None:
    positions = [got.index(r) for r in expected]
    assert positions == sorted(positions), got


def assert_invariants(decision: Decision) -> None:
    assert decision.mode in ("speculative", "standard")
    assert decision.resolved_mode in ("speculative", "standard")
    if decision.mode == "standard":
        assert decision.proposer is None and decision.draft_version is None and decision.k is None
    else:
        assert decision.proposer in ("draft", "prompt_lookup", "prediction")
        assert (decision.draft_version is not None) == (decision.proposer == "draft")
        assert decision.k is not None and decision.k_min <= decision.k <= decision.k_max
    assert all(c == c.lower() and " " not in c for c in decision.reason_codes)
    round_trip = json.loads(json.dumps(decision.to_dict(), allow_nan=False))
    assert round_trip["decision_id"] == decision.decision_id
    assert round_trip["reason_codes"] == list(decision.reason_codes)
