"""A served speculative request folds its per-token acceptance into the tenant's and the
global history, in memory and in the database (what the next decision reads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.database import Database
from gateway.engine.schema import DecodeResult
from gateway.engine.stats import DecodeStats
from gateway.serving.decisions import GLOBAL, PolicyService
from gateway.serving.ratelimit import Limits
from gateway.settings import ROOT
from policies.types import Load, RequestFeatures

POLICIES = str(ROOT / "policies" / "bundles")


async def test_the_history_takes_each_requests_per_token_acceptance(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/p.db"
    store = await Database.connect(url, upgrade=True)
    service = PolicyService(store, POLICIES, Limits(10, 1000))
    try:
        await service.start()
        f = RequestFeatures(
            endpoint="completions", model="m", requested_mode="speculative",
            requested_proposer="draft", requested_k=None, max_tokens=64, temperature=0.0,
            top_p=1.0, seed=None, has_prediction=False, constraint="none", prompt_tokens=9,
        )  # fmt: skip
        plan = service.decide("acme", f, ("2",), None, Load(queue_depth=0, capacity=8))
        assert plan.decision.mode == "speculative" and plan.decision.draft_version == "2"
        stats = DecodeStats(mode="speculative", proposer="draft")
        for drafted, accepted in ((4, 4), (4, 1), (4, 0), (2, 2)):
            stats.record_verify(drafted, accepted)
        assert (stats.drafted, stats.accepted, stats.rejected_steps) == (14, 7, 2)
        result = DecodeResult((1,) * 11, "x", "length", (), 9, stats)
        await service.observe(plan, result)
        for tenant in ("acme", GLOBAL):
            entry = service.history[(tenant, "draft", "2")]
            assert entry.acceptance == pytest.approx(7 / 9)  # not accepted / drafted, 0.5
            assert entry.samples == 1
        again = PolicyService(store, POLICIES, Limits(10, 1000))  # another replica
        await again.refresh_history(force=True)
        assert again.history[("acme", "draft", "2")].acceptance == pytest.approx(7 / 9)
    finally:
        await store.close()
