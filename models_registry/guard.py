"""The automatic rollback guard: compare a canary arm with its baseline arm.

Two signals decide, once both arms have ``min_samples`` requests:

- acceptance rate alpha = accepted / drafted. The canary is rolled back when
  ``alpha_baseline - alpha_canary > max_acceptance_drop`` (absolute, e.g. 0.10).
- per-token decode latency: median ms/token over the arm's requests (or, without samples,
  1000 / tokens-per-second). Rolled back when ``canary / baseline - 1 > max_latency_regression``
  (relative, e.g. 0.25 = 25 % slower).

An arm that drafted nothing (a baseline of standard decoding) has no alpha; the acceptance
check is skipped and only latency decides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from models_registry.errors import InvalidConfig

_EPS = 1e-12


def _check_number(name: str, value: object, lo: float, hi: float, integer: bool = False) -> None:
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidConfig(f"{name} must be {kind}, got {value!r}")
    if integer and not isinstance(value, int):
        raise InvalidConfig(f"{name} must be {kind}, got {value!r}")
    if not (lo <= value <= hi) or math.isnan(value):
        raise InvalidConfig(f"{name} must be between {lo:g} and {hi:g}, got {value!r}")


def _from_mapping(cls_name: str, data: object, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise InvalidConfig(f"{cls_name} must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InvalidConfig(f"{cls_name}: unknown field {unknown[0]!r}")
    return data


@dataclass(frozen=True)
class Guard:
    """Rollback thresholds for one rollout."""

    min_samples: int = 200
    """Requests each arm needs before the guard judges (fewer: always 'continue')."""
    max_acceptance_drop: float = 0.10
    """Largest tolerated absolute fall of the acceptance rate, canary vs baseline."""
    max_latency_regression: float = 0.25
    """Largest tolerated relative rise of median per-token latency, canary vs baseline."""
    window: int = 1000
    """Most recent requests per arm to judge on (0 = every request since the start)."""

    def __post_init__(self) -> None:
        _check_number("min_samples", self.min_samples, 1, 10**9, integer=True)
        _check_number("max_acceptance_drop", self.max_acceptance_drop, 0.0, 1.0)
        _check_number("max_latency_regression", self.max_latency_regression, 0.0, 100.0)
        _check_number("window", self.window, 0, 10**9, integer=True)
        if self.window and self.window < self.min_samples:
            raise InvalidConfig(
                f"window ({self.window}) must be 0 or at least min_samples ({self.min_samples})"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> Guard:
        """Missing fields take their defaults; unknown fields are an error naming the field."""
        fields = _from_mapping("guard", data, set(cls.__dataclass_fields__))
        return cls(**fields)


@dataclass(frozen=True)
class RequestSample:
    """One finished request's decoding counters."""

    drafted: int
    accepted: int
    tokens: int
    decode_seconds: float


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class ArmStats:
    """Aggregated counters of one arm (canary or baseline) of a rollout."""

    requests: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    decode_seconds: float = 0.0
    latencies_ms: tuple[float, ...] = ()
    """Per-request decode latency per emitted token, in ms/token."""

    @classmethod
    def from_samples(cls, samples: Sequence[RequestSample], window: int = 0) -> ArmStats:
        """Aggregate the last ``window`` samples (all when window is 0)."""
        chosen = list(samples[-window:]) if window else list(samples)
        return cls(
            requests=len(chosen),
            drafted=sum(s.drafted for s in chosen),
            accepted=sum(s.accepted for s in chosen),
            tokens=sum(s.tokens for s in chosen),
            decode_seconds=sum(s.decode_seconds for s in chosen),
            latencies_ms=tuple(1000.0 * s.decode_seconds / s.tokens for s in chosen if s.tokens),
        )

    @property
    def acceptance(self) -> float | None:
        """alpha = accepted / drafted; None when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else None

    def percentile(self, q: float) -> float | None:
        return percentile(self.latencies_ms, q)

    @property
    def p50(self) -> float | None:
        return self.percentile(50)

    @property
    def p95(self) -> float | None:
        return self.percentile(95)

    @property
    def p99(self) -> float | None:
        return self.percentile(99)

    @property
    def ms_per_token(self) -> float | None:
        """Median per-token latency, else 1000 / tokens-per-second; None without data."""
        if self.latencies_ms:
            return self.p50
        tps = self.tokens_per_second
        return 1000.0 / tps if tps else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["latencies_ms"] = list(self.latencies_ms)
        return data

    @classmethod
    def from_dict(cls, data: object) -> ArmStats:
        fields = dict(_from_mapping("arm stats", data, set(cls.__dataclass_fields__)))
        fields["latencies_ms"] = tuple(float(x) for x in fields.get("latencies_ms", ()))
        return cls(**fields)


@dataclass(frozen=True)
class GuardVerdict:
    action: Literal["continue", "rollback"]
    reason: str

    @property
    def rollback(self) -> bool:
        return self.action == "rollback"


def evaluate_guard(guard: Guard, canary: ArmStats, baseline: ArmStats) -> GuardVerdict:
    """Decide whether the canary may go on; every violated threshold is named in the reason."""
    if min(canary.requests, baseline.requests) < guard.min_samples:
        return GuardVerdict(
            "continue",
            f"waiting for samples: canary {canary.requests}, baseline {baseline.requests}, "
            f"need {guard.min_samples} each",
        )
    problems: list[str] = []
    notes: list[str] = []
    a_can, a_base = canary.acceptance, baseline.acceptance
    if a_can is not None and a_base is not None:
        drop = a_base - a_can
        notes.append(f"acceptance {a_can:.3f} vs baseline {a_base:.3f}")
        if drop > guard.max_acceptance_drop + _EPS:
            problems.append(
                f"acceptance dropped {drop:.3f} ({a_base:.3f} -> {a_can:.3f}), "
                f"more than max_acceptance_drop {guard.max_acceptance_drop:.3f}"
            )
    l_can, l_base = canary.ms_per_token, baseline.ms_per_token
    if l_can is not None and l_base:
        regression = l_can / l_base - 1.0
        notes.append(f"{l_can:.2f} vs baseline {l_base:.2f} ms/token")
        if regression > guard.max_latency_regression + _EPS:
            problems.append(
                f"per-token latency rose {regression:.1%} ({l_base:.2f} -> {l_can:.2f} ms), "
                f"more than max_latency_regression {guard.max_latency_regression:.0%}"
            )
    if problems:
        return GuardVerdict("rollback", "; ".join(problems))
    return GuardVerdict("continue", "healthy: " + ("; ".join(notes) or "no comparable signal"))
