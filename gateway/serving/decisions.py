"""Feeds the policy decision point and keeps what it learns.

``PolicyService`` owns the active policy bundle (files on disk + tenant documents put
through the admin API, persisted so restarts and replicas agree), the acceptance history
(an in-memory view of the database's acceptance_stats rows, refreshed periodically and
written through after each speculative request) and each tenant's last auto outcome
(hysteresis). It turns a request into a ``DecisionContext`` and the decision into a
``Plan`` that the generation service executes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.database import AdminEvent, Database
from gateway.engine import DecodeResult
from gateway.serving.errors import GatewayError, invalid
from gateway.serving.ratelimit import Limits
from policies import (
    Activation,
    Capabilities,
    Decision,
    DecisionContext,
    HistoryEntry,
    Load,
    PolicyError,
    PolicyStore,
    RequestFeatures,
    build_bundle,
    decide,
    update_history,
)
from policies.bundle import PolicyBundle, load_bundle_dir, thaw
from policies.document import Fairness

log = logging.getLogger("gateway.policy")
GLOBAL = "*"
REFRESH_S = 5.0
HistoryKey = tuple[str, str, str]  # (tenant, proposer, draft_version or "")


@dataclass(frozen=True)
class Plan:
    """The decision plus the tenant's limits and lists that the request runs under."""

    decision: Decision
    limits: Limits
    allowed_token_ids: tuple[int, ...] | None
    banned_token_ids: tuple[int, ...]
    retention_days: int
    ewma_alpha: float
    fairness: Fairness
    reasoning_budget: int | None = None
    """Most thinking tokens before the answer (the tenant's reasoning.max_tokens)."""


DraftChooser = Callable[[str, str, str, Callable[[str], bool]], str | None]
"""(target, request_id, tenant_id, tenant_allows_version) -> the rollout's pick or None."""


class PolicyService:
    def __init__(
        self,
        store: Database,
        policy_dir: str,
        defaults: Limits,
        choose_draft: DraftChooser | None = None,
    ) -> None:
        """`choose_draft` (the rollouts' split) serves dry runs only: a real request's
        pipeline asks the rollouts itself and passes the pick to `decide`."""
        self.store = store
        self.policy_dir = policy_dir
        self.defaults = defaults
        self.policies = PolicyStore()
        self.history: dict[HistoryKey, HistoryEntry] = {}
        self.previous_mode: dict[str, str] = {}
        self.choose_draft: DraftChooser = choose_draft or (lambda *_: None)
        self._refreshed = 0.0
        self._refreshing: asyncio.Task[None] | None = None
        self._versions: dict[str, int] = {}
        """Tenant -> version of its stored document now in force here."""
        self._rng = random.Random()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        activation = self.policies.load_dir(self.policy_dir)
        await self.refresh_policies()
        await self._event("gateway", "policy.activated", "bundle", activation)
        await self.refresh_history(force=True)

    async def refresh_policies(self) -> list[str]:
        """Put in force the tenant documents another replica (or an earlier run) stored
        since this one last looked; returns the tenants whose document changed."""
        changed = []
        for row in await self.store.latest_policies():
            tenant = row["tenant_id"]
            if tenant == GLOBAL or self._versions.get(tenant, 0) >= row["version"]:
                continue
            self._versions[tenant] = row["version"]
            try:
                self.policies.put_tenant(tenant, row["document"])
            except PolicyError as exc:
                log.error("stored policy for %s no longer validates: %s", tenant, exc)
                continue
            changed.append(tenant)
        return changed

    async def _event(self, actor: str, action: str, subject: str, activation: Activation) -> None:
        if activation.changed:
            await self.store.append_admin(
                AdminEvent(
                    actor,
                    action,
                    subject,
                    {"revision": activation.before} if activation.before else None,
                    {
                        "revision": activation.after,
                        "version": activation.version,
                        "source": activation.source,
                    },
                )
            )

    async def refresh_history(self, force: bool = False) -> None:
        """Reload the shared history from the database (other replicas write it too)."""
        if not force and time.monotonic() - self._refreshed < REFRESH_S:
            return
        self._refreshed = time.monotonic()
        try:
            rows = await self.store.list_acceptance()
        except Exception as exc:  # history is advisory: keep the last view, decide on it
            log.warning("acceptance history refresh failed: %s", exc)
            return
        self.history = {
            (r["tenant_id"], r["proposer"], r["draft_version"]): HistoryEntry(
                acceptance=r["ewma_acceptance"], c=r["ewma_c"], samples=r["samples"]
            )
            for r in rows
        }

    def _refresh_in_background(self) -> None:
        """Keep database reads off the request path: a stale view is refreshed by a task
        while this request decides on the view it has."""
        if self._refreshing is None and time.monotonic() - self._refreshed >= REFRESH_S:
            self._refreshing = asyncio.get_running_loop().create_task(self.refresh_history())
            self._refreshing.add_done_callback(self._refreshed_done)

    def _refreshed_done(self, _: asyncio.Task[None]) -> None:
        self._refreshing = None

    async def stop(self) -> None:
        if self._refreshing is not None:
            await self._refreshing

    # -- per request ----------------------------------------------------------------------

    def _histories(self, tenant: str) -> tuple[dict[Any, HistoryEntry], dict[Any, HistoryEntry]]:
        mine: dict[Any, HistoryEntry] = {}
        everyone: dict[Any, HistoryEntry] = {}
        for (t, proposer, version), entry in self.history.items():
            key = (proposer, version or None)
            if t == tenant:
                mine[key] = entry
            elif t == GLOBAL:
                everyone[key] = entry
        return mine, everyone

    def allows_draft_version(self, tenant: str) -> Callable[[str], bool]:
        """The tenant's policy on draft versions (the rollout split respects it)."""
        return self.policies.active.policy_for(tenant).speculation.allows_draft_version

    def proposers_for(self, tenant: str) -> tuple[str, ...]:
        """The proposers the tenant's policy allows now."""
        return self.policies.active.policy_for(tenant).speculation.proposers

    def context(
        self,
        tenant: str,
        f: RequestFeatures,
        draft_versions: tuple[str, ...],
        preferred: str | None,
        load: Load,
    ) -> DecisionContext:
        mine, everyone = self._histories(tenant)
        return DecisionContext(
            tenant_id=tenant,
            request=f,
            history=mine,
            global_history=everyone,
            load=load,
            capabilities=Capabilities(draft_versions, preferred),
            previous_mode=self.previous_mode.get(tenant),
            probe_draw=self._rng.random(),
            decision_id=uuid.uuid4().hex,
        )

    def decide(
        self,
        tenant: str,
        f: RequestFeatures,
        draft_versions: tuple[str, ...],
        preferred: str | None,
        load: Load,
    ) -> Plan:
        """The decision for one request, with the limits and lists it runs under.
        `preferred`: the rollout's draft version for this request (None: no preference)."""
        self._refresh_in_background()
        ctx = self.context(tenant, f, draft_versions, preferred, load)
        bundle = self.policies.active
        decision = decide(bundle, ctx)
        if decision.auto_outcome is not None:
            self.previous_mode[tenant] = decision.auto_outcome
        policy = bundle.policy_for(tenant)
        return Plan(
            decision=decision,
            limits=self.limits_for(tenant),
            allowed_token_ids=policy.tokens.allowed_token_ids or None,
            banned_token_ids=policy.tokens.banned_token_ids,
            retention_days=policy.payload_retention_days,
            ewma_alpha=policy.auto.ewma_alpha,
            fairness=policy.fairness,
            reasoning_budget=policy.reasoning.max_tokens,
        )

    def limits_for(self, tenant: str) -> Limits:
        """The tenant's rate limits now (its policy's, or the gateway's defaults; a dry-run
        policy's are not enforced)."""
        rl = self.policies.active.policy_for(tenant).rate_limits
        if rl.enforcement == "dryrun":
            return Limits(10**9, 10**12)
        return Limits(
            requests_per_minute=rl.requests_per_minute or self.defaults.requests_per_minute,
            tokens_per_minute=rl.tokens_per_minute or self.defaults.tokens_per_minute,
        )

    def fairness_for(self, tenant: str) -> Fairness:
        """The tenant's share of the inference worker now (serving/fairness.py)."""
        return self.policies.active.policy_for(tenant).fairness

    async def observe(self, plan: Plan, result: DecodeResult | None) -> None:
        """Fold a finished speculative request into the tenant's and the global history."""
        d = plan.decision
        stats = result.stats if result else None
        if d.mode != "speculative" or d.proposer is None or stats is None or not stats.drafted:
            return
        proposer = d.proposer
        version = d.draft_version or ""
        rows = []
        for tenant in (d.tenant_id, GLOBAL):
            key = (tenant, proposer, version)
            entry = update_history(
                self.history.get(key), stats.drafted, stats.accepted, stats.c, plan.ewma_alpha,
                rejections=stats.rejected_steps,
            )  # fmt: skip
            self.history[key] = entry
            rows.append((tenant, proposer, version, entry.acceptance, entry.c, entry.samples))
        await self.store.put_acceptances(rows)

    # -- admin ----------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        bundle = self.policies.active
        return {"revision": bundle.revision, "version": bundle.version, "bundle": bundle.to_dict()}

    def validate_tenant(self, tenant: str, doc: dict[str, Any]) -> dict[str, Any]:
        """What put_tenant would check, without activating or storing anything: the
        revision the bundle would get, or a 400 naming the problem."""
        bundle = self.policies.active
        tenants = {t: thaw(d) for t, d in bundle.tenants.items()}
        tenants[tenant] = doc
        try:
            candidate = build_bundle(thaw(bundle.default), tenants)
        except PolicyError as exc:
            raise invalid(f"invalid policy document: {exc}", "document") from None
        return {"tenant": tenant, "valid": True, "revision": candidate.revision}

    async def put_tenant(self, tenant: str, doc: dict[str, Any], actor: str) -> dict[str, Any]:
        previous = self.policies.active.tenants.get(tenant)
        try:
            activation = self.policies.put_tenant(tenant, doc)
        except PolicyError as exc:
            raise invalid(f"invalid policy document: {exc}", "document") from None
        if activation.changed:
            try:
                row = await self.store.put_policy(tenant, doc, activation.after, actor=actor)
            except Exception as exc:  # not stored: not in force here either (replicas agree)
                if previous is None:
                    self.policies.remove_tenant(tenant)
                else:
                    self.policies.put_tenant(tenant, thaw(previous))
                raise GatewayError(
                    "unavailable", "the policy store is unavailable; the document was not "
                    "activated", code="database_unavailable", retry_after=2,
                ) from exc  # fmt: skip
            self._versions[tenant] = max(self._versions.get(tenant, 0), row["version"])
        return {"tenant": tenant, **activation.to_dict()}

    async def reload(self, actor: str) -> dict[str, Any]:
        """Re-read the policy files and put the tenant documents stored through the API back
        over them, as a start does (``start``: the files, then ``refresh_policies``): a
        stored document wins over the file of the same tenant, until the tenant's next put.
        A refusal (a file, or a stored document against the new default) changes nothing."""
        try:
            files = load_bundle_dir(self.policy_dir)
            activation = self.policies.activate(
                self._with_stored(files), f"load_dir:{self.policy_dir}"
            )
        except PolicyError as exc:
            raise invalid(
                "the policy files (with the tenant documents stored through the API over "
                f"them) were refused, the active bundle stays: {exc}"
            ) from None
        await self._event(actor, "policy.activated", "bundle", activation)
        return activation.to_dict()

    def _with_stored(self, files: PolicyBundle) -> PolicyBundle:
        """The files' bundle with the stored tenant documents in force here over it: those
        of the tenants whose stored version this replica applied (``_versions``: put here,
        or read by ``refresh_policies``), taken from the active bundle."""
        active = self.policies.active
        tenants = {t: thaw(d) for t, d in files.tenants.items()}
        for tenant in self._versions:
            if tenant in active.tenants:
                tenants[tenant] = thaw(active.tenants[tenant])
        return build_bundle(thaw(files.default), tenants)

    async def resolve(self, body: dict[str, Any], depth: int) -> dict[str, Any]:
        tenant = body.get("tenant")
        request = body.get("request") or {}
        if not isinstance(tenant, str) or not isinstance(request, dict):
            raise invalid('send {"tenant": str, "request": {...}}', "tenant")
        raw = request.get("decoding")
        d: dict[str, Any] = raw if isinstance(raw, dict) else {}
        try:
            f = RequestFeatures(
                endpoint=str(request.get("endpoint", "chat.completions")),
                model=str(request.get("model", "")),
                requested_mode=d.get("mode", "auto") if d else None,
                requested_proposer=d.get("proposer"),
                requested_k=d.get("k"),
                max_tokens=int(request.get("max_tokens", 256)),
                temperature=float(request.get("temperature", 1.0)),
                top_p=float(request.get("top_p", 1.0)),
                seed=request.get("seed"),
                has_prediction=bool(request.get("prediction")),
                constraint=str(request.get("constraint", "none")),
                prompt_tokens=int(request.get("prompt_tokens", 0)),
            )
        except (TypeError, ValueError) as exc:
            raise invalid(f"bad request features: {exc}", "request") from None
        versions = tuple(request.get("draft_versions", ()))
        allows = self.allows_draft_version(tenant)
        preferred = self.choose_draft(f.model, "dry-run", tenant, allows)
        ctx = self.context(tenant, f, versions, preferred, Load(queue_depth=depth, capacity=0))
        decision = decide(self.policies.active, ctx)
        return {"decision": decision.to_dict()}
