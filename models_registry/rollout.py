"""Draft rollouts: a pure state machine moving a draft version from canary to full.

::

    start ──> canary ──> promoted      (terminal: every request gets the new version)
                │ ▲  ╲
                ▼ │   ╲──> rolled_back (terminal: every request gets the baseline)
               paused ──> promoted | rolled_back

While ``canary``, ``canary_percent`` of the traffic (see ``split.choose_version``) gets the
new version; ``paused`` freezes the rollout on the baseline without giving it up. Every
function returns a new ``Rollout``; storage and clocks belong to the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from models_registry.errors import InvalidConfig, InvalidTransition
from models_registry.guard import Guard, GuardVerdict
from models_registry.regression import GateVerdict


class RolloutState(StrEnum):
    CANARY = "canary"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


TRANSITIONS: Mapping[RolloutState, frozenset[RolloutState]] = {
    RolloutState.CANARY: frozenset(
        {RolloutState.PAUSED, RolloutState.PROMOTED, RolloutState.ROLLED_BACK}
    ),
    RolloutState.PAUSED: frozenset(
        {RolloutState.CANARY, RolloutState.PROMOTED, RolloutState.ROLLED_BACK}
    ),
    RolloutState.PROMOTED: frozenset(),
    RolloutState.ROLLED_BACK: frozenset(),
}
"""Legal moves; promoted and rolled_back are terminal."""


class PromotionBlocked(InvalidTransition):
    """Promotion refused because the regression gate found a mismatch."""


@dataclass(frozen=True)
class Rollout:
    """One draft version's rollout against the baseline draft version of the same target."""

    id: str
    target: str
    """Target model name whose requests are split."""
    draft: str
    """Draft model name."""
    version: str
    """The new draft version being rolled out (the canary arm)."""
    baseline_version: str | None
    """The draft version serving the rest; None = no draft (standard decoding)."""
    canary_percent: float
    """Share of traffic (0-100, two decimals) routed to ``version`` while in canary."""
    sticky: bool = False
    """Split by tenant (each tenant sees one version) instead of by request."""
    state: RolloutState = RolloutState.CANARY
    guard: Guard = field(default_factory=Guard)
    reason: str = ""
    """Why the rollout is in its current state (last transition's reason)."""

    def __post_init__(self) -> None:
        for name in ("id", "target", "draft", "version"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidConfig(f"{name} must be a non-empty string, got {value!r}")
        if self.baseline_version is not None and not isinstance(self.baseline_version, str):
            raise InvalidConfig(
                f"baseline_version must be a string or null, got {self.baseline_version!r}"
            )
        if self.baseline_version == self.version:
            raise InvalidConfig(f"version {self.version!r} equals baseline_version")
        pct = self.canary_percent
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 <= pct <= 100:
            raise InvalidConfig(f"canary_percent must be a number from 0 to 100, got {pct!r}")
        if not isinstance(self.sticky, bool):
            raise InvalidConfig(f"sticky must be true or false, got {self.sticky!r}")
        if not isinstance(self.guard, Guard):
            raise InvalidConfig(f"guard must be a Guard, got {type(self.guard).__name__}")
        try:
            object.__setattr__(self, "state", RolloutState(self.state))
        except ValueError:
            states = ", ".join(s.value for s in RolloutState)
            raise InvalidConfig(f"state must be one of {states}, got {self.state!r}") from None

    @property
    def terminal(self) -> bool:
        return not TRANSITIONS[self.state]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``from_dict(to_dict(r)) == r``."""
        return {
            "id": self.id,
            "target": self.target,
            "draft": self.draft,
            "version": self.version,
            "baseline_version": self.baseline_version,
            "canary_percent": self.canary_percent,
            "sticky": self.sticky,
            "state": self.state.value,
            "guard": self.guard.to_dict(),
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: object) -> Rollout:
        """Rebuild from ``to_dict`` output; a bad or unknown field raises InvalidConfig."""
        if not isinstance(data, Mapping):
            raise InvalidConfig(f"rollout must be a JSON object, got {type(data).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidConfig(f"rollout: unknown field {unknown[0]!r}")
        required = ("id", "target", "draft", "version", "canary_percent")
        missing = [k for k in required if k not in data]
        if missing:
            raise InvalidConfig(f"rollout: missing field {missing[0]!r}")
        fields = dict(data)
        fields["guard"] = Guard.from_dict(fields.get("guard", {}))
        fields.setdefault("baseline_version", None)
        for key in ("version", "baseline_version"):
            if isinstance(fields[key], int) and not isinstance(fields[key], bool):
                fields[key] = str(fields[key])
        return cls(**fields)


@dataclass(frozen=True, kw_only=True)
class ProposedRollout:
    """A rollout as an operator asks for it: what ``start_rollout`` starts (checked there,
    by ``Rollout``)."""

    target: str
    draft: str
    version: str
    """The new draft version (an integer is taken as its string)."""
    baseline_version: str | None
    """The draft version serving the rest; None = no draft (standard decoding)."""
    canary_percent: float
    sticky: bool = False
    guard: Guard | None = None
    """None: the default guard."""


def start_rollout(id: str, proposed: ProposedRollout, reason: str = "started") -> Rollout:
    """start -> canary."""
    baseline = proposed.baseline_version
    return Rollout(
        id=id,
        target=proposed.target,
        draft=proposed.draft,
        version=str(proposed.version),
        baseline_version=None if baseline is None else str(baseline),
        canary_percent=proposed.canary_percent,
        sticky=proposed.sticky,
        state=RolloutState.CANARY,
        guard=proposed.guard or Guard(),
        reason=reason,
    )


def transition(rollout: Rollout, to: RolloutState | str, reason: str) -> Rollout:
    """Move to ``to`` or raise InvalidTransition naming both states and the legal moves."""
    try:
        dest = RolloutState(to)
    except ValueError:
        states = ", ".join(s.value for s in RolloutState)
        raise InvalidTransition(f"unknown rollout state {to!r} (states: {states})") from None
    legal = TRANSITIONS[rollout.state]
    if dest not in legal:
        allowed = ", ".join(sorted(s.value for s in legal)) or "none, it is terminal"
        raise InvalidTransition(
            f"rollout {rollout.id}: cannot go from {rollout.state.value} to {dest.value} "
            f"(allowed: {allowed})"
        )
    return replace(rollout, state=dest, reason=reason)


def pause(rollout: Rollout, reason: str = "paused") -> Rollout:
    return transition(rollout, RolloutState.PAUSED, reason)


def resume(rollout: Rollout, reason: str = "resumed") -> Rollout:
    return transition(rollout, RolloutState.CANARY, reason)


def rollback(rollout: Rollout, reason: str = "rolled back") -> Rollout:
    return transition(rollout, RolloutState.ROLLED_BACK, reason)


def promote(rollout: Rollout, gate: GateVerdict | None = None, reason: str = "") -> Rollout:
    """-> promoted; refused (PromotionBlocked) when a given regression gate did not pass."""
    if gate is not None and not gate.passed:
        raise PromotionBlocked(
            f"rollout {rollout.id}: promotion blocked by the regression gate: {gate.reason}"
        )
    default = "promoted" if gate is None else f"promoted; {gate.reason}"
    return transition(rollout, RolloutState.PROMOTED, reason or default)


def set_canary_percent(rollout: Rollout, percent: float, reason: str = "") -> Rollout:
    """Ramp the canary share; only while canary or paused."""
    if rollout.terminal:
        raise InvalidTransition(
            f"rollout {rollout.id}: cannot change canary_percent once {rollout.state.value}"
        )
    return replace(
        rollout, canary_percent=percent, reason=reason or f"canary_percent set to {percent:g}"
    )


def apply_guard(rollout: Rollout, verdict: GuardVerdict) -> Rollout:
    """Roll back a canary whose guard said so; anything else is returned unchanged."""
    if verdict.rollback and rollout.state is RolloutState.CANARY:
        return rollback(rollout, f"guard: {verdict.reason}")
    return rollout


__all__ = [
    "TRANSITIONS",
    "PromotionBlocked",
    "ProposedRollout",
    "Rollout",
    "RolloutState",
    "apply_guard",
    "pause",
    "promote",
    "resume",
    "rollback",
    "set_canary_percent",
    "start_rollout",
    "transition",
]
