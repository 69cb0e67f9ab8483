"""Draft registry and rollouts as admin use cases: register versions, start a rollout,
pause, resume, roll back, promote. Promotion runs the regression set on the inference
worker first: greedy speculative output with the new draft must equal standard output
token for token.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from gateway.database.rollouts import NewRollout
from gateway.engine import EngineError, LoadedModel
from gateway.serving.errors import GatewayError, invalid
from gateway.serving.regression_gate import run_regression_gate
from gateway.serving.rollouts.traffic import RolloutTraffic
from gateway.serving.rollouts.view import RolloutView, rollout_of
from gateway.serving.worker import InferenceWorker
from models_registry import manifest as registry
from models_registry import regression as reg
from models_registry import rollout as rl
from models_registry.errors import IncompatibleDraft, ManifestError, RegistryError
from models_registry.guard import ArmStats, Guard, evaluate_guard
from models_registry.manifest import ModelEntry
from models_registry.rollout import PromotionBlocked, Rollout, RolloutState

log = logging.getLogger("gateway.rollouts")
ROLLOUT_FIELDS = frozenset(
    {"target", "draft", "version", "baseline_version", "canary_percent", "sticky", "guard"}
)
MODEL_FIELDS = frozenset({"name", "version", "role", "target", "path"})


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


def _arm_view(stats: ArmStats) -> dict[str, Any]:
    return {
        **stats.to_dict(),
        "acceptance": stats.acceptance,
        "tokens_per_second": stats.tokens_per_second,
        "p50_ms": stats.p50,
        "p95_ms": stats.p95,
    }


class RolloutAdmin:
    def __init__(self, view: RolloutView, traffic: RolloutTraffic, worker: InferenceWorker) -> None:
        self.view = view
        self.traffic = traffic
        self.store = view.store
        self.pool = view.pool
        self.worker = worker
        self.regression_set: str | Path | None = None
        """JSONL prompt set for the promotion gate (None = the registry's default set)."""
        self._promoting: set[str] = set()
        self._refused: set[str] = set()

    async def start(self) -> None:
        """Adopt API-registered versions into the pool's manifest, then load rollouts."""
        await self.adopt_registered()
        await self.view.refresh()

    async def adopt_registered(self) -> list[str]:
        """Serve the versions registered through the API (here before a restart, or on
        another replica: the path must be on a volume every replica mounts); returns the
        ones added now. Called at start and by the services' sync loop."""
        added = []
        rows = await self.store.list_models()
        for row in sorted(rows, key=lambda r: r["role"] != "target"):
            if self.view.entry(row["name"], row["version"]) is not None:
                continue
            keys = ("name", "version", "role", "sha256", "target")
            entry = ModelEntry(path=Path(row["path"]), **{k: row[k] for k in keys})
            try:
                self.pool.manifest = self.pool.manifest.with_entry(entry)
            except RegistryError as exc:
                if entry.key not in self._refused:
                    self._refused.add(entry.key)
                    log.error("registered model %s is not served: %s", entry.key, exc)
                continue
            added.append(entry.key)
        return added

    # -- models ------------------------------------------------------------------------------

    @staticmethod
    def _model_view(e: ModelEntry | dict[str, Any], status: str) -> dict[str, Any]:
        d = e if isinstance(e, dict) else asdict(e)
        keys = ("name", "version", "role", "target", "sha256")
        return {**{k: d[k] for k in keys}, "path": str(d["path"]), "status": status}

    async def models(self) -> list[dict[str, Any]]:
        """Every registered version; a draft also says whether it serves now and why
        (`serving`: default, canary, baseline or null; `serving_reason`), the one answer
        the console and the README give too."""
        rows = {(r["name"], r["version"]): r for r in await self.store.list_models()}
        out = [
            self._model_view(e, rows.pop((e.name, e.version), {}).get("status", "active"))
            for e in self.pool.manifest.entries
        ]
        views = out + [self._model_view(r, r["status"]) for r in rows.values()]
        for v in views:
            if v["role"] == "draft":
                serving = self._serving(v["target"], v["name"], v["version"])
                v["serving"], v["serving_reason"] = serving
        return views

    def _serving(self, target: str, name: str, version: str) -> tuple[str | None, str | None]:
        """How a draft version serves its target's speculative requests now: as an active
        rollout's canary or baseline, or as the default (the last promoted version, else the
        first registered), for tenants whose policy allows it; else (None, None)."""
        r = self.view.active(target)
        if r is not None:
            if name != r.draft:
                return None, None
            if version == r.version:
                return "canary", f"rollout {r.id} sends it {r.canary_percent:g}% of requests"
            if version == r.baseline_version:
                return "baseline", f"rollout {r.id} keeps it for the other requests"
            return None, None
        promoted = self.view.default_version(target)
        if promoted is not None:
            return ("default", "the last promoted version") if version == promoted else (None, None)
        versions = self.pool.draft_versions(target)
        if versions and version == versions[0]:
            return "default", "the first registered version (no rollout has promoted another)"
        return None, None

    async def register(self, body: dict[str, Any], actor: str) -> dict[str, Any]:
        """Hash, check and record a new version from a local directory; servable at once."""
        _unknown(body, MODEL_FIELDS)
        name, version, role, path = (_text(body, k) for k in ("name", "version", "role", "path"))
        target = _text(body, "target", required=role == "draft")
        assert name and version and role and path
        if role not in ("target", "draft"):
            raise invalid(f"role must be 'target' or 'draft', got '{role}'", "role")
        if self.view.entry(name, version) or await self.store.get_model(name, version):
            raise GatewayError(
                "conflict", f"{name}@{version} is already registered", param="version"
            )
        base = self.pool.manifest
        try:
            new = registry.NewVersion(name, version, role, target)  # type: ignore[arg-type]
            entry = await asyncio.to_thread(registry.register, base, path, new)
            self.pool.manifest.with_entry(entry)  # validate before the row is written
        except IncompatibleDraft as exc:
            raise invalid(f"incompatible draft: {exc}", "path", "incompatible_draft") from None
        except ManifestError as exc:
            if "already registered" in str(exc) or "listed twice" in str(exc):
                raise GatewayError("conflict", str(exc), param="version") from None
            raise invalid(str(exc), "target" if "target" in str(exc) else None) from None
        except RegistryError as exc:
            raise invalid(str(exc), "target" if target and target in str(exc) else "path") from None
        await self.view.insert_model(entry, "registered", actor)
        self.pool.manifest = self.pool.manifest.with_entry(entry)  # the newest one: no await
        return self._model_view(entry, "registered")

    # -- rollouts ----------------------------------------------------------------------------

    async def _view(self, r: Rollout) -> dict[str, Any]:
        canary, baseline = await self.traffic.arm_stats(r)
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
        entry = self.view.entry(draft, version)
        if entry is None or entry.role != "draft" or entry.target != target:
            raise GatewayError(
                "not_found", f"no draft {draft}@{version} registered for {target}", param="version"
            )
        await self.view.refresh()
        busy = self.view.active(target)
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
        elif self.view.entry(draft, baseline) is None:
            raise invalid(f"baseline {draft}@{baseline} is not registered", "baseline_version")
        try:
            guard = Guard.from_dict(body.get("guard") or {})
            pct, sticky = body.get("canary_percent"), body.get("sticky", False)
            proposed = rl.ProposedRollout(
                target=target,
                draft=draft,
                version=version,
                baseline_version=baseline,
                canary_percent=pct,  # type: ignore[arg-type]  # checked by Rollout
                sticky=sticky,
                guard=guard,
            )
            probe = rl.start_rollout("0", proposed)
        except RegistryError as exc:
            raise invalid(f"invalid rollout: {exc}") from None
        try:
            await self.pool.draft(target, version)  # fail now, not per request
        except (RegistryError, EngineError, OSError) as exc:
            raise invalid(f"{draft}@{version} cannot be loaded: {exc}", "version") from None
        fields = {**probe.to_dict(), "guard": guard.to_dict()}
        del fields["id"]
        row = await self.store.create_rollout(NewRollout(**fields), actor=actor)
        r = rollout_of(row)
        self.view.rollouts[r.id] = r
        self.view.seen[r.id] = row["updated_at"]
        await self.view.set_status(entry, "canary", actor)
        return await self._view(r)

    def baseline_for(self, target: str, draft: str, version: str) -> str | None:
        """What serves the draft's traffic now: the last promoted version, else the version the
        policy engine falls back to (the oldest registered one); None = no draft yet."""
        promoted = self.view.default_version(target)
        if promoted is not None and promoted != version:
            return promoted
        versions = (v for v in self.pool.draft_versions(target) if v != version)
        return next((v for v in versions if self.view.entry(draft, v) is not None), None)

    async def list(self) -> list[dict[str, Any]]:
        await self.view.refresh()
        rollouts = sorted(self.view.rollouts.values(), key=lambda r: int(r.id))
        return [await self._view(r) for r in rollouts]

    async def _get(self, rollout_id: str) -> Rollout:
        await self.view.refresh()
        r = self.view.rollouts.get(rollout_id.strip())
        if r is None:
            raise GatewayError("not_found", f"no rollout '{rollout_id}'", param="id")
        return r

    async def get(self, rollout_id: str) -> dict[str, Any]:
        return await self._view(await self._get(rollout_id))

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
            await self.view.finish_rollback(new, actor)
        else:
            await self.view.save(new, actor, state=new.state.value, reason=new.reason)
        return await self._view(new)

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
        r = self.view.rollouts[r.id]  # the guard may have rolled it back while the gate ran
        try:
            new = rl.promote(r, verdict)
        except PromotionBlocked:
            blocked = replace(r, reason=f"promotion blocked: {verdict.reason}")
            await self.view.save(blocked, actor, reason=blocked.reason)
            raise
        await self.view.save(new, actor, state=new.state.value, reason=new.reason)
        entry = self.view.entry(r.draft, r.version)
        if entry is not None:
            await self.view.set_status(entry, "active", actor)
        old = self.view.entry(r.draft, r.baseline_version) if r.baseline_version else None
        if old is not None:
            await self.view.set_status(old, "retired", actor)
        return {**(await self._view(new)), "gate": asdict(verdict)}

    async def run_regression(self, target: str, draft: LoadedModel) -> reg.GateVerdict:
        """Greedy standard vs speculative on every regression prompt, on the inference worker."""
        _, engine = await self.pool.target(target)
        return await run_regression_gate(engine, draft, self.worker, self.regression_set)
