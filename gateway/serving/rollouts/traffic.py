"""Rollouts per request: which draft version serves it (the traffic split), and the guard.

Live arm stats (canary vs baseline) are per replica, fed by ``observe`` after each served
request's audit record is written; the guard judges them after every request an arm
served and rolls a bad canary back (actor ``guard``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.database import RequestRecord
from gateway.engine import DecodeResult
from gateway.serving.rollouts.view import RolloutView
from models_registry import rollout as rl
from models_registry.guard import ArmStats, RequestSample, evaluate_guard
from models_registry.rollout import Rollout, RolloutState
from models_registry.split import choose_version

log = logging.getLogger("gateway.rollouts")
MAX_SAMPLES = 100_000


@dataclass
class Arms:
    """Live samples of one rollout's two arms (this replica only)."""

    canary: deque[RequestSample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    baseline: deque[RequestSample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def stats(self, window: int) -> tuple[ArmStats, ArmStats]:
        arms = (self.canary, self.baseline)
        canary, baseline = (ArmStats.from_samples(list(a), window) for a in arms)
        return canary, baseline


class RolloutTraffic:
    def __init__(self, view: RolloutView) -> None:
        self.view = view
        self._arms: dict[str, Arms] = {}

    def arm_stats(self, r: Rollout) -> tuple[ArmStats, ArmStats]:
        return self._arms.get(r.id, Arms()).stats(r.guard.window)

    def choose(
        self, target: str, request_id: str, tenant: str, allows: Callable[[str], bool]
    ) -> str | None:
        """The draft version for this request: the active rollout's split, else the promoted
        default; None = no preference (the policy engine picks among allowed versions)."""
        r = self.view.active(target)
        if r is not None:
            return choose_version(r, request_id, tenant, allows)
        version = self.view.default_version(target)
        return version if version is not None and allows(version) else None

    def observe(self, record: RequestRecord, result: DecodeResult | None) -> None:
        """After a request's audit record: feed the arm that served it, then ask the guard."""
        self.view.maybe_refresh()  # on the serving loop: pick up other replicas' changes
        if record.status != 200 or record.target_model is None:
            return
        r = self.view.active(record.target_model)
        if r is None or r.state is not RolloutState.CANARY:
            return
        if record.draft_version is not None and record.draft_model != r.draft:
            return
        arms = self._arms.setdefault(r.id, Arms())
        if record.draft_version == r.version:
            arm = arms.canary
        elif record.draft_version == r.baseline_version:
            arm = arms.baseline
        else:
            return
        stats = result.stats if result is not None else None
        if stats is not None:
            seconds = stats.draft_s + stats.verify_s + stats.other_s
        else:
            seconds = (record.latency_ms or 0.0) / 1000.0
        tokens = record.completion_tokens
        arm.append(RequestSample(record.drafted_tokens, record.accepted_tokens, tokens, seconds))
        verdict = evaluate_guard(r.guard, *arms.stats(r.guard.window))
        after = rl.apply_guard(r, verdict)
        if after is not r:
            log.warning("rollout %s rolled back by the guard: %s", r.id, verdict.reason)
            self.view.rollouts[r.id] = after  # the split stops at once; the write follows
            self.view.detach(self.view.finish_rollback(after, "guard"))
