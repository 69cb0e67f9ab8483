"""Draft registry and rollouts as use cases: register versions, split traffic, guard, promote.

Rollout state lives in the database (``rollouts`` rows, admin events through ``actor=``); this
service keeps an in-memory view for the per-request ``choose`` and reloads it at start, before
admin reads and every few seconds while traffic flows, so replicas and restarts agree. Live arm
stats (canary vs baseline) are per replica, fed by a Recorder listener; the guard judges them
after every request an arm served and rolls a bad canary back (actor ``guard``). Promotion runs
the regression set on the inference worker first: greedy speculative output with the new draft
must equal standard output token for token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.audit import AuditStore, RequestRecord
from gateway.engine import EngineError, LoadedModel
from gateway.serving.errors import GatewayError, invalid
from gateway.serving.models import ModelPool
from gateway.serving.recorder import Recorder
from gateway.serving.regression_gate import run_regression_gate
from gateway.serving.worker import InferenceWorker
from models_registry import manifest as registry
from models_registry import regression as reg
from models_registry import rollout as rl
from models_registry.errors import IncompatibleDraft, ManifestError, RegistryError
from models_registry.guard import ArmStats, Guard, RequestSample, evaluate_guard
from models_registry.manifest import ModelEntry
from models_registry.rollout import PromotionBlocked, Rollout, RolloutState
from models_registry.split import choose_version

log = logging.getLogger("gateway.rollouts")
REFRESH_S = 5.0
MAX_SAMPLES = 100_000
ACTIVE = (RolloutState.CANARY, RolloutState.PAUSED)
ROLLOUT_FIELDS = frozenset(
    {"target", "draft", "version", "baseline_version", "canary_percent", "sticky", "guard"}
)
MODEL_FIELDS = frozenset({"name", "version", "role", "target", "path"})


@dataclass
class _Arms:
    """Live samples of one rollout's two arms (this replica only)."""

    canary: deque[RequestSample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    baseline: deque[RequestSample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def stats(self, window: int) -> tuple[ArmStats, ArmStats]:
        arms = (self.canary, self.baseline)
        canary, baseline = (ArmStats.from_samples(list(a), window) for a in arms)
        return canary, baseline


def _text(body: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and key.endswith("version"):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise invalid(f"'{key}' must be a non-empty string", key)
    return value


def _unknown(body: dict[str, Any], allowed: frozenset[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise invalid(
            f"unknown field '{extra[0]}' (allowed: {', '.join(sorted(allowed))})", extra[0]
        )


def _rollout_of(row: dict[str, Any]) -> Rollout:
    fields = {k: row[k] for k in Rollout.__dataclass_fields__}
    fields.update(id=str(row["id"]), guard=row["guard"] or {}, reason=row["reason"] or "")
    return Rollout.from_dict({**fields, "sticky": bool(row["sticky"])})


def _arm_view(stats: ArmStats) -> dict[str, Any]:
    return {
        **stats.to_dict(),
        "acceptance": stats.acceptance,
        "tokens_per_second": stats.tokens_per_second,
        "p50_ms": stats.p50,
        "p95_ms": stats.p95,
    }


class RolloutService:
    def __init__(
        self, store: AuditStore, pool: ModelPool, worker: InferenceWorker, recorder: Recorder
    ) -> None:
        self.store = store
        self.pool = pool
        self.worker = worker
        self.recorder = recorder
        self.regression_set: str | Path | None = None
        """JSONL prompt set for the promotion gate (None = the registry's default set)."""
        self._rollouts: dict[str, Rollout] = {}
        self._seen: dict[str, Any] = {}  # id -> updated_at of the row last applied
        self._arms: dict[str, _Arms] = {}
        self._refreshed = 0.0
        self._refreshing = False
        self._promoting: set[str] = set()

    # -- lifecycle and database view ---------------------------------------------------------

    async def start(self) -> None:
        """Adopt API-registered versions into the pool's manifest, load rollouts, listen."""
        rows = await self.store.list_models()
        for row in sorted(rows, key=lambda r: r["role"] != "target"):
            if self._entry(row["name"], row["version"]) is not None:
                continue
            keys = ("name", "version", "role", "sha256", "target")
            entry = ModelEntry(path=Path(row["path"]), **{k: row[k] for k in keys})
            try:
                self.pool.manifest = self.pool.manifest.with_entry(entry)
            except RegistryError as exc:
                log.error("registered model %s is not served: %s", entry.key, exc)
        await self.refresh()
        self.recorder.listeners.append(self.observe)

    async def refresh(self) -> None:
        """Reload rollouts from the database (other replicas and the guard write them too)."""
        self._refreshed = time.monotonic()
        for row in await self.store.list_rollouts():
            key = str(row["id"])
            old, seen = self._rollouts.get(key), self._seen.get(key)
            if seen is not None and row["updated_at"] <= seen:
                continue
            try:
                new = _rollout_of(row)
            except (RegistryError, ValueError) as exc:
                log.error("rollout %s in the database is unusable: %s", key, exc)
                continue
            if old is not None and old.terminal and not new.terminal:
                continue  # a guard rollback not yet written: never revive a finished rollout
            self._rollouts[key] = new
            self._seen[key] = row["updated_at"]

    async def _background_refresh(self) -> None:
        try:
            await self.refresh()
        finally:
            self._refreshing = False

    def _maybe_refresh(self) -> None:
        if self._refreshing or time.monotonic() - self._refreshed < REFRESH_S:
            return
        self._refreshing = True
        self.recorder.detach(self._background_refresh())

    async def _save(self, r: Rollout, actor: str, **changes: Any) -> Rollout:
        row = await self.store.update_rollout(int(r.id), actor=actor, **changes)
        if row is not None:
            self._seen[r.id] = row["updated_at"]
        self._rollouts[r.id] = r
        return r

    async def _insert(self, e: ModelEntry, status: str, actor: str | None) -> None:
        await self.store.register_model(
            e.name, e.version, role=e.role, path=str(e.path), sha256=e.sha256,
            target=e.target, status=status, actor=actor,
        )  # fmt: skip

    async def _set_status(self, entry: ModelEntry, status: str, actor: str) -> None:
        """Record a version's status; manifest-file versions get their row on first change."""
        if await self.store.get_model(entry.name, entry.version) is None:
            await self._insert(entry, "active", None)
        await self.store.set_model_status(entry.name, entry.version, status, actor=actor)

    # -- per request -------------------------------------------------------------------------

    def _active(self, target: str) -> Rollout | None:
        return next(
            (r for r in self._rollouts.values() if r.target == target and r.state in ACTIVE),
            None,
        )

    def default_version(self, target: str) -> str | None:
        """The last promoted draft version of ``target`` still registered, else None."""
        have = set(self.pool.draft_versions(target))
        promoted = [
            r
            for r in self._rollouts.values()
            if r.target == target and r.state is RolloutState.PROMOTED and r.version in have
        ]
        return max(promoted, key=lambda r: int(r.id)).version if promoted else None

    def choose(
        self, target: str, request_id: str, tenant: str, allows: Callable[[str], bool]
    ) -> str | None:
        """The draft version for this request: the active rollout's split, else the promoted
        default; None = no preference (the policy engine picks among allowed versions)."""
        r = self._active(target)
        if r is not None:
            return choose_version(r, request_id, tenant, allows)
        version = self.default_version(target)
        return version if version is not None and allows(version) else None

    def observe(self, record: RequestRecord, result: Any) -> None:
        """Recorder listener: feed the arm that served the request, then ask the guard."""
        self._maybe_refresh()  # on the serving loop: pick up other replicas' changes
        if record.status != 200 or record.target_model is None:
            return
        r = self._active(record.target_model)
        if r is None or r.state is not RolloutState.CANARY:
            return
        if record.draft_version is not None and record.draft_model != r.draft:
            return
        arms = self._arms.setdefault(r.id, _Arms())
        if record.draft_version == r.version:
            arm = arms.canary
        elif record.draft_version == r.baseline_version:
            arm = arms.baseline
        else:
            return
        stats = getattr(result, "stats", None)
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
            self._rollouts[r.id] = after  # the split stops at once; the write follows
            self.recorder.detach(self._finish_rollback(after, "guard"))

    async def _finish_rollback(self, r: Rollout, actor: str) -> None:
        await self._save(r, actor, state=r.state.value, reason=r.reason)
        self.pool.unload_draft(r.draft, r.version)  # requests in flight keep their reference
        entry = self._entry(r.draft, r.version)
        if entry is not None:
            await self._set_status(entry, "registered", actor)

    # -- models ------------------------------------------------------------------------------

    def _entry(self, name: str, version: str) -> ModelEntry | None:
        return next(
            (e for e in self.pool.manifest.entries if e.name == name and e.version == version), None
        )

    @staticmethod
    def _model_view(e: ModelEntry | dict[str, Any], status: str) -> dict[str, Any]:
        d = e if isinstance(e, dict) else asdict(e)
        keys = ("name", "version", "role", "target", "sha256")
        return {**{k: d[k] for k in keys}, "path": str(d["path"]), "status": status}

    async def models(self) -> list[dict[str, Any]]:
        rows = {(r["name"], r["version"]): r for r in await self.store.list_models()}
        out = [
            self._model_view(e, rows.pop((e.name, e.version), {}).get("status", "active"))
            for e in self.pool.manifest.entries
        ]
        return out + [self._model_view(r, r["status"]) for r in rows.values()]

    async def register(self, body: dict[str, Any], actor: str) -> dict[str, Any]:
        """Hash, check and record a new version from a local directory; servable at once."""
        _unknown(body, MODEL_FIELDS)
        name, version, role, path = (_text(body, k) for k in ("name", "version", "role", "path"))
        target = _text(body, "target", required=role == "draft")
        assert name and version and role and path
        if role not in ("target", "draft"):
            raise invalid(f"role must be 'target' or 'draft', got '{role}'", "role")
        if self._entry(name, version) or await self.store.get_model(name, version):
            raise GatewayError(
                "conflict", f"{name}@{version} is already registered", param="version"
            )
        base = self.pool.manifest
        try:
            entry = await asyncio.to_thread(
                registry.register, base, path, name, version, role, target  # type: ignore[arg-type]
            )  # fmt: skip
            self.pool.manifest.with_entry(entry)  # validate before the row is written
        except IncompatibleDraft as exc:
            raise invalid(f"incompatible draft: {exc}", "path", "incompatible_draft") from None
        except ManifestError as exc:
            if "already registered" in str(exc) or "listed twice" in str(exc):
                raise GatewayError("conflict", str(exc), param="version") from None
            raise invalid(str(exc), "target" if "target" in str(exc) else None) from None
        except RegistryError as exc:
            raise invalid(str(exc), "target" if target and target in str(exc) else "path") from None
        await self._insert(entry, "registered", actor)
        self.pool.manifest = self.pool.manifest.with_entry(entry)  # the newest one: no await
        return self._model_view(entry, "registered")

    # -- rollouts ----------------------------------------------------------------------------

    def _view(self, r: Rollout) -> dict[str, Any]:
        canary, baseline = self._arms.get(r.id, _Arms()).stats(r.guard.window)
        return {
            **r.to_dict(),
            "canary": _arm_view(canary),
            "baseline": _arm_view(baseline),
            "guard_verdict": evaluate_guard(r.guard, canary, baseline).reason,
        }

    async def start_rollout(self, body: dict[str, Any], actor: str) -> dict[str, Any]:
        _unknown(body, ROLLOUT_FIELDS)
        target, draft, version = (_text(body, k) for k in ("target", "draft", "version"))
        assert target and draft and version
        if target not in self.pool.target_names():
            raise GatewayError("not_found", f"no target model '{target}'", param="target")
        entry = self._entry(draft, version)
        if entry is None or entry.role != "draft" or entry.target != target:
            raise GatewayError(
                "not_found", f"no draft {draft}@{version} registered for {target}", param="version"
            )
        await self.refresh()
        busy = self._active(target)
        if busy is not None:
            raise GatewayError(
                "conflict",
                f"rollout {busy.id} of {busy.draft}@{busy.version} on {target} is "
                f"still {busy.state.value}; promote or roll it back first",
                param="target",
            )
        baseline = _text(body, "baseline_version", required=False)
        if baseline is None:
            baseline = self.baseline_for(target, draft, version)
        elif self._entry(draft, baseline) is None:
            raise invalid(f"baseline {draft}@{baseline} is not registered", "baseline_version")
        try:
            guard = Guard.from_dict(body.get("guard") or {})
            pct, sticky = body.get("canary_percent"), body.get("sticky", False)
            probe = rl.start_rollout("0", target, draft, version, baseline, pct, sticky=sticky,  # type: ignore[arg-type]
                                     guard=guard)  # fmt: skip
        except RegistryError as exc:
            raise invalid(f"invalid rollout: {exc}") from None
        try:
            await self.pool.draft(target, version)  # fail now, not per request
        except (RegistryError, EngineError, OSError) as exc:
            raise invalid(f"{draft}@{version} cannot be loaded: {exc}", "version") from None
        fields = {**probe.to_dict(), "guard": guard.to_dict()}
        del fields["id"]
        row = await self.store.create_rollout(**fields, actor=actor)
        r = _rollout_of(row)
        self._rollouts[r.id] = r
        self._seen[r.id] = row["updated_at"]
        await self._set_status(entry, "canary", actor)
        return self._view(r)

    def baseline_for(self, target: str, draft: str, version: str) -> str | None:
        """What serves the draft's traffic now: the last promoted version, else the version the
        policy engine falls back to (the oldest registered one); None = no draft yet."""
        promoted = self.default_version(target)
        if promoted is not None and promoted != version:
            return promoted
        versions = (v for v in self.pool.draft_versions(target) if v != version)
        return next((v for v in versions if self._entry(draft, v) is not None), None)

    async def list(self) -> list[dict[str, Any]]:
        await self.refresh()
        return [self._view(r) for r in sorted(self._rollouts.values(), key=lambda r: int(r.id))]

    async def _get(self, rollout_id: str) -> Rollout:
        await self.refresh()
        r = self._rollouts.get(rollout_id.strip())
        if r is None:
            raise GatewayError("not_found", f"no rollout '{rollout_id}'", param="id")
        return r

    async def get(self, rollout_id: str) -> dict[str, Any]:
        return self._view(await self._get(rollout_id))

    async def act(self, rollout_id: str, action: str, actor: str) -> dict[str, Any]:
        r = await self._get(rollout_id)
        moves = {"pause": rl.pause, "resume": rl.resume, "rollback": rl.rollback}
        try:
            if action == "promote":
                return await self._promote(r, actor)
            if action not in moves:
                raise invalid(f"unknown rollout action '{action}'", "action")
            new = moves[action](r, f"{action} by {actor}")
        except PromotionBlocked as exc:
            raise GatewayError("conflict", str(exc), code="regression_gate") from None
        except RegistryError as exc:
            raise GatewayError("conflict", str(exc), code="invalid_transition") from None
        if new.state is RolloutState.ROLLED_BACK:
            await self._finish_rollback(new, actor)
        else:
            await self._save(new, actor, state=new.state.value, reason=new.reason)
        return self._view(new)

    async def _promote(self, r: Rollout, actor: str) -> dict[str, Any]:
        rl.transition(r, RolloutState.PROMOTED, "")  # refuse an illegal move before the gate runs
        if r.id in self._promoting:
            raise GatewayError("conflict", f"rollout {r.id}: a promotion is already running")
        self._promoting.add(r.id)
        try:
            handle = await self.pool.draft(r.target, r.version)  # (re)load
            verdict = await self.run_regression(r.target, handle.model)
        except (EngineError, OSError) as exc:
            raise invalid(f"{r.draft}@{r.version} cannot be checked: {exc}") from None
        finally:
            self._promoting.discard(r.id)
        r = self._rollouts[r.id]  # the guard may have rolled it back while the gate ran
        try:
            new = rl.promote(r, verdict)
        except PromotionBlocked:
            blocked = replace(r, reason=f"promotion blocked: {verdict.reason}")
            await self._save(blocked, actor, reason=blocked.reason)
            raise
        await self._save(new, actor, state=new.state.value, reason=new.reason)
        entry = self._entry(r.draft, r.version)
        if entry is not None:
            await self._set_status(entry, "active", actor)
        old = self._entry(r.draft, r.baseline_version) if r.baseline_version else None
        if old is not None:
            await self._set_status(old, "retired", actor)
        return {**self._view(new), "gate": asdict(verdict)}

    async def run_regression(self, target: str, draft: LoadedModel) -> reg.GateVerdict:
        """Greedy standard vs speculative on every regression prompt, on the inference worker."""
        _, engine = await self.pool.target(target)
        return await run_regression_gate(engine, draft, self.worker, self.regression_set)
