from __future__ import annotations

import numpy as np
import pytest

from models_registry.guard import ArmStats, Guard, RequestSample, evaluate_guard, percentile

GUARD = Guard(min_samples=100, max_acceptance_drop=0.10, max_latency_regression=0.25, window=0)


def arm(requests: int, acceptance: float, ms_per_token: float = 10.0) -> ArmStats:
    drafted = requests * 40
    tokens = requests * 50
    return ArmStats(
        requests=requests,
        drafted=drafted,
        accepted=round(drafted * acceptance),
        tokens=tokens,
        decode_seconds=tokens * ms_per_token / 1000,
        latencies_ms=tuple(ms_per_token for _ in range(requests)),
    )


def test_healthy_canary_continues() -> None:
    verdict = evaluate_guard(GUARD, arm(200, 0.66), arm(2000, 0.70))
    assert verdict.action == "continue" and not verdict.rollback
    assert "healthy" in verdict.reason and "0.660" in verdict.reason


def test_acceptance_drop_beyond_margin_rolls_back() -> None:
    verdict = evaluate_guard(GUARD, arm(200, 0.55), arm(2000, 0.70))
    assert verdict.action == "rollback"
    assert "acceptance dropped 0.150" in verdict.reason
    assert "max_acceptance_drop 0.100" in verdict.reason


def test_drop_exactly_at_margin_is_tolerated() -> None:
    assert evaluate_guard(GUARD, arm(200, 0.60), arm(200, 0.70)).action == "continue"


def test_no_verdict_before_min_samples() -> None:
    terrible = arm(99, 0.05, ms_per_token=100.0)
    verdict = evaluate_guard(GUARD, terrible, arm(5000, 0.70))
    assert verdict.action == "continue"
    assert "waiting for samples: canary 99" in verdict.reason
    # the baseline arm needs its samples too
    assert evaluate_guard(GUARD, arm(500, 0.05), arm(10, 0.7)).action == "continue"
    assert evaluate_guard(GUARD, arm(100, 0.05), arm(100, 0.7)).action == "rollback"


def test_latency_regression_rolls_back() -> None:
    verdict = evaluate_guard(GUARD, arm(200, 0.70, 13.0), arm(200, 0.70, 10.0))
    assert verdict.action == "rollback"
    assert "per-token latency rose 30.0%" in verdict.reason
    assert evaluate_guard(GUARD, arm(200, 0.70, 12.0), arm(200, 0.70, 10.0)).action == "continue"


def test_both_problems_are_reported() -> None:
    verdict = evaluate_guard(GUARD, arm(200, 0.40, 20.0), arm(200, 0.70, 10.0))
    assert "acceptance dropped" in verdict.reason and "latency rose" in verdict.reason


def test_tokens_per_second_used_without_latency_samples() -> None:
    slow = ArmStats(requests=200, drafted=100, accepted=70, tokens=1000, decode_seconds=20.0)
    fast = ArmStats(requests=200, drafted=100, accepted=70, tokens=1000, decode_seconds=10.0)
    assert slow.ms_per_token == pytest.approx(20.0)
    assert evaluate_guard(GUARD, slow, fast).action == "rollback"
    assert evaluate_guard(GUARD, fast, slow).action == "continue"


def test_standard_decoding_baseline_skips_acceptance() -> None:
    no_draft = ArmStats(requests=300, tokens=3000, decode_seconds=30.0)
    assert no_draft.acceptance is None
    verdict = evaluate_guard(GUARD, arm(300, 0.10, 9.0), no_draft)
    assert verdict.action == "continue"


def test_percentiles_match_numpy() -> None:
    values = [float(v) for v in np.random.default_rng(0).gamma(2.0, 5.0, size=101)]
    stats = ArmStats(requests=101, latencies_ms=tuple(values))
    for q, got in ((50, stats.p50), (95, stats.p95), (99, stats.p99)):
        assert got == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None
    assert ArmStats().p50 is None and ArmStats().ms_per_token is None


def test_from_samples_window_and_properties() -> None:
    samples = [
        RequestSample(drafted=10, accepted=i % 11, tokens=20, decode_seconds=0.2) for i in range(50)
    ]
    stats = ArmStats.from_samples(samples, window=10)
    assert stats.requests == 10
    assert stats.accepted == sum(i % 11 for i in range(40, 50))
    assert stats.acceptance == pytest.approx(stats.accepted / 100)
    assert stats.tokens_per_second == pytest.approx(100.0)
    assert stats.p50 == pytest.approx(10.0)
    assert ArmStats.from_samples(samples).requests == 50
    assert ArmStats.from_dict(stats.to_dict()) == stats
