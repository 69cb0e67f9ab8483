"""Rollouts per request: which draft version serves it (the traffic split), and the guard.

Arm statistics are pooled across replicas: after each served request's audit record, the
arm that served it gets a ``rollout_samples`` row in the shared database, and the guard
judges the newest ``window`` samples of both arms, whichever replica served them. Every
replica may judge; acting on a rollback verdict is a compare-and-set on the rollout's row
(``state = 'canary'`` -> ``'rolled_back'``), so exactly one replica writes the rollback and
its admin event (actor ``guard``); the others see the row changed and stop the canary too.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

from gateway.database import RequestRecord
from gateway.engine import DecodeResult
from gateway.serving.rollouts.view import RolloutView
from models_registry import rollout as rl
from models_registry.guard import ArmStats, RequestSample, evaluate_guard
from models_registry.rollout import Rollout, RolloutState
from models_registry.split import choose_version

log = logging.getLogger("gateway.rollouts")
JUDGE_EVERY_S = 0.25
"""Least time between two judgements of one rollout by one replica (each reads the window)."""
REPLICA = f"{socket.gethostname()}:{os.getpid()}"[:64]


class RolloutTraffic:
    def __init__(self, view: RolloutView) -> None:
        self.view = view
        self.store = view.store
        self._judging: set[str] = set()
        self._judged: dict[str, float] = {}

    async def arm_stats(self, r: Rollout) -> tuple[ArmStats, ArmStats]:
        """Canary and baseline over the newest ``guard.window`` samples of every replica."""
        stats = []
        for arm in ("canary", "baseline"):
            rows = await self.store.rollout_samples(int(r.id), arm, r.guard.window)
            samples = [
                RequestSample(x["drafted"], x["accepted"], x["tokens"], x["decode_seconds"])
                for x in rows
            ]
            stats.append(ArmStats.from_samples(samples))
        return stats[0], stats[1]

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

    async def observe(self, record: RequestRecord, result: DecodeResult | None) -> None:
        """After a request's audit record: store the arm's sample (awaited, so a list read
        after the response counts it), then ask the guard in the background."""
        self.view.maybe_refresh()  # on the serving loop: pick up other replicas' changes
        if record.status != 200 or record.target_model is None:
            return
        r = self.view.active(record.target_model)
        if r is None or r.state is not RolloutState.CANARY:
            return
        if record.draft_version is not None and record.draft_model != r.draft:
            return
        if record.draft_version == r.version:
            arm = "canary"
        elif record.draft_version == r.baseline_version:
            arm = "baseline"
        else:
            return
        stats = result.stats if result is not None else None
        if stats is not None:
            seconds = stats.draft_s + stats.verify_s + stats.other_s
        else:
            seconds = (record.latency_ms or 0.0) / 1000.0
        sample = RequestSample(
            record.drafted_tokens, record.accepted_tokens, record.completion_tokens, seconds
        )
        try:
            await self.store.add_rollout_sample(
                int(r.id), arm, drafted=sample.drafted, accepted=sample.accepted,
                tokens=sample.tokens, decode_seconds=sample.decode_seconds, replica=REPLICA,
            )  # fmt: skip
        except Exception as exc:  # the record is written; a lost sample only delays the guard
            log.warning("rollout %s: sample not stored: %s", r.id, exc)
            return
        self.view.detach(self._judge_soon(r))

    async def _judge_soon(self, r: Rollout) -> None:
        now = time.monotonic()
        if r.id in self._judging or now - self._judged.get(r.id, 0.0) < JUDGE_EVERY_S:
            return
        self._judging.add(r.id)
        try:
            await self.judge(r)
        finally:
            self._judged[r.id] = time.monotonic()
            self._judging.discard(r.id)

    async def judge(self, r: Rollout) -> bool:
        """Judge the pooled arms; on a rollback verdict try to act on it. True when this
        replica rolled the canary back (one replica does, whichever judged first)."""
        current = self.view.rollouts.get(r.id, r)
        if current.state is not RolloutState.CANARY:
            return False
        verdict = evaluate_guard(current.guard, *await self.arm_stats(current))
        after = rl.apply_guard(current, verdict)
        if after is current:
            return False
        self.view.rollouts[r.id] = after  # the split stops at once; the write follows
        won = await self.view.finish_rollback(after, "guard", expect_state="canary")
        if won:
            log.warning("rollout %s rolled back by the guard: %s", r.id, verdict.reason)
        return won
