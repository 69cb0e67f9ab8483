"""The decision function: bundle + request context -> Decision. Pure; no clock, no randomness.

Steps, in order (each names the YAML rule that decided in `Decision.rule_ids`):

1. mode            the tenant's `mode`, or the request's `decoding` when `client_override`
                   allows it (else "override_denied"). "standard" stops here.
2. min_max_tokens  max_tokens below `speculation.min_max_tokens` -> standard.
3. proposer        requested (if allowed and servable) or the first servable of
                   prediction (request has prediction text) > draft (a version available and
                   allowed; the rollout's preferred one first) > suffix > prompt_lookup.
                   None -> standard.
4. k bounds        `speculation.k`, narrowed to the request's k when honoured.
5. cost model      acceptance a and cost ratio c for (proposer, draft_version): the tenant's
                   history once it has `auto.min_samples`, else the global history, else
                   `auto.prior`; best k and S(a, k, c) over the bounds.
6. auto            speculative iff S > 1 + margin, moved by +-hysteresis depending on the
                   previous outcome; a standard outcome still speculates when
                   probe_draw < probe_rate ("probe"), so the history keeps refreshing.
7. gates           determinism (seed set -> standard), load (queue_depth >= shed_queue_depth).

A rule whose enforcement is "dryrun" never changes the outcome; it appends "dryrun:<code>"
to `Decision.dryrun` when it would have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType

from policies.bundle import PolicyBundle
from policies.costmodel import best_k, verify_cost_at
from policies.document import ENFORCE, TenantPolicy
from policies.types import (
    MODES,
    Decision,
    DecisionContext,
    HistoryEntry,
    HistoryKey,
    Reason,
    dryrun,
)


@dataclass
class _Trace:
    """Local scratchpad of one decision (never escapes `decide`)."""

    reasons: list[str] = field(default_factory=list)
    rule_ids: list[str] = field(default_factory=list)
    dryrun: list[str] = field(default_factory=list)
    inputs: dict[str, object] = field(default_factory=dict)

    def because(self, reason: str, rule_id: str | None) -> None:
        self.reasons.append(reason)
        if rule_id is not None and rule_id not in self.rule_ids:
            self.rule_ids.append(rule_id)

    def rule(self, enforcement: str, reason: str, rule_id: str) -> bool:
        """A rule fired. Returns True when it is enforced; a dry-run rule is only recorded."""
        if enforcement == ENFORCE:
            self.because(reason, rule_id)
            return True
        self.dryrun.append(dryrun(reason))
        return False


@dataclass(frozen=True)
class _Outcome:
    resolved_mode: str
    mode: str
    proposer: str | None = None
    draft_version: str | None = None
    k: int | None = None
    auto_outcome: str | None = None


def decide(bundle: PolicyBundle, ctx: DecisionContext) -> Decision:
    """Decide how to decode one request under `bundle` (active or candidate: dry-run)."""
    policy = bundle.policy_for(ctx.tenant_id)
    trace = _Trace()
    req = ctx.request
    trace.inputs.update(
        queue_depth=ctx.load.queue_depth,
        capacity=ctx.load.capacity,
        batch_rows=ctx.load.batch_rows,
        max_tokens=req.max_tokens,
    )
    k_min, k_max = policy.speculation.k_min, policy.speculation.k_max
    outcome, k_bounds = _run(policy, ctx, trace, (k_min, k_max))
    return Decision(
        decision_id=ctx.decision_id,
        policy_revision=bundle.revision,
        policy_version=bundle.version,
        tenant_id=ctx.tenant_id,
        requested_mode=req.requested_mode,
        resolved_mode=outcome.resolved_mode,
        mode=outcome.mode,
        proposer=outcome.proposer if outcome.mode == "speculative" else None,
        draft_version=outcome.draft_version if outcome.mode == "speculative" else None,
        k_min=k_bounds[0],
        k_max=k_bounds[1],
        k=outcome.k if outcome.mode == "speculative" else None,
        auto_outcome=outcome.auto_outcome,
        reason_codes=tuple(trace.reasons),
        rule_ids=tuple(trace.rule_ids),
        inputs=MappingProxyType(dict(trace.inputs)),
        dryrun=tuple(trace.dryrun),
        tree=_tree(policy, outcome),
    )


def _tree(policy: TenantPolicy, outcome: _Outcome) -> tuple[int, ...]:
    """The policy's tree shape for a speculative draft (model or head); () otherwise."""
    if outcome.mode != "speculative" or outcome.proposer not in ("draft", "head"):
        return ()
    return policy.speculation.tree


def _run(
    policy: TenantPolicy, ctx: DecisionContext, trace: _Trace, k_bounds: tuple[int, int]
) -> tuple[_Outcome, tuple[int, int]]:
    req = ctx.request
    spec = policy.speculation

    # 1. mode
    override = _override_honoured(policy, ctx, trace)
    mode = policy.mode
    if override and req.requested_mode is not None:
        if req.requested_mode in MODES:
            mode = req.requested_mode
        else:
            trace.because(Reason.UNKNOWN_REQUESTED_MODE, None)
    trace.because(f"mode_{mode}", "client_override" if mode != policy.mode else "mode")
    if mode == "standard":
        return _Outcome(resolved_mode="standard", mode="standard"), k_bounds

    # 2. minimum max_tokens
    if req.max_tokens < spec.min_max_tokens and trace.rule(
        spec.enforcement, Reason.MAX_TOKENS_BELOW_MINIMUM, "speculation.min_max_tokens"
    ):
        return _Outcome(resolved_mode=_unresolved(mode), mode="standard"), k_bounds

    # 3. proposer
    proposer, version = _pick_proposer(policy, ctx, trace, override)
    if proposer is None:
        return _Outcome(resolved_mode=_unresolved(mode), mode="standard"), k_bounds

    # 4. k bounds
    if override and req.requested_k is not None:
        k = min(max(req.requested_k, k_bounds[0]), k_bounds[1])
        if k != req.requested_k:
            trace.because(Reason.K_CLAMPED, "speculation.k")
        k_bounds = (k, k)

    # 5. cost model
    a, c = _acceptance_and_cost(policy, ctx, (proposer, version), trace)
    verify = ctx.load.verify_cost or None
    k_best, speedup = best_k(a, c, k_bounds[0], k_bounds[1], verify)
    trace.inputs.update(k_best=k_best, expected_speedup=speedup)
    if verify is not None:
        trace.inputs["verify_cost_at_k"] = verify_cost_at(verify, k_best)

    # 6. auto
    resolved, auto_outcome, effective = mode, None, "speculative"
    if mode == "auto":
        auto_outcome = _resolve_auto(policy, ctx, speedup, trace)
        resolved = effective = auto_outcome
        if auto_outcome == "standard" and ctx.probe_draw < policy.auto.probe_rate:
            trace.because(Reason.PROBE, "auto.probe_rate")
            effective = "speculative"

    # 7. gates
    if effective == "speculative" and _gates_force_standard(policy, ctx, trace):
        effective = "standard"
    outcome = _Outcome(resolved, effective, proposer, version, k_best, auto_outcome)
    return outcome, k_bounds


def _unresolved(mode: str) -> str:
    """resolved_mode when a step stopped before the cost model: auto counts as standard."""
    return "standard" if mode == "auto" else mode


def _override_honoured(policy: TenantPolicy, ctx: DecisionContext, trace: _Trace) -> bool:
    req = ctx.request
    asked = (req.requested_mode, req.requested_proposer, req.requested_k)
    if all(v is None for v in asked):
        return False
    rule = policy.client_override
    if not rule.allow and trace.rule(rule.enforcement, Reason.OVERRIDE_DENIED, "client_override"):
        return False
    trace.because(Reason.OVERRIDE_HONOURED, "client_override")
    return True


def _pick_proposer(
    policy: TenantPolicy, ctx: DecisionContext, trace: _Trace, override: bool
) -> tuple[str | None, str | None]:
    """(proposer, draft_version) or (None, None) when nothing can serve the request."""
    spec = policy.speculation
    req = ctx.request
    requested = req.requested_proposer if override else None
    if (
        requested is not None
        and requested not in spec.proposers
        and trace.rule(spec.enforcement, Reason.PROPOSER_NOT_ALLOWED, "speculation.proposers")
    ):
        requested = None
    if requested is not None:
        # The client named a proposer: serve with it or fall back to standard.
        if requested == "prediction" and not req.has_prediction:
            trace.because(Reason.PREDICTION_MISSING, "builtin.compatibility")
            return None, None
        if requested == "draft":
            version = _pick_draft_version(policy, ctx, trace)
            if version is None:
                return None, None
            return "draft", version
        if requested in ("prediction", "prompt_lookup", "suffix"):
            return requested, None
        trace.because(Reason.PROPOSER_NOT_ALLOWED, "builtin.compatibility")  # unknown name
        return None, None

    enforce = spec.enforcement == ENFORCE
    for candidate in ("prediction", "draft", "suffix", "prompt_lookup"):
        if enforce and candidate not in spec.proposers:
            continue
        if candidate == "prediction" and not req.has_prediction:
            continue
        version = None
        if candidate == "draft":
            version = _pick_draft_version(policy, ctx, trace, quiet=True)
            if version is None:
                continue
        if candidate not in spec.proposers:
            trace.dryrun.append(dryrun(Reason.PROPOSER_NOT_ALLOWED))
        return candidate, version
    trace.because(Reason.NO_PROPOSER_AVAILABLE, "speculation.proposers")
    return None, None


def _pick_draft_version(
    policy: TenantPolicy, ctx: DecisionContext, trace: _Trace, *, quiet: bool = False
) -> str | None:
    """The rollout's preferred version if available and allowed, else the first allowed one
    in the registry's order. `quiet`: do not explain a None (the caller tries others)."""
    spec = policy.speculation
    available = ctx.capabilities.draft_versions
    preferred = ctx.capabilities.preferred_draft_version
    if not available:
        if not quiet:
            trace.because(Reason.DRAFT_UNAVAILABLE, "builtin.compatibility")
        return None
    if spec.enforcement != ENFORCE:
        pick = preferred if preferred is not None and preferred in available else available[0]
        if not spec.allows_draft_version(pick):
            trace.dryrun.append(dryrun(Reason.DRAFT_VERSION_NOT_ALLOWED))
        return pick
    allowed = [v for v in available if spec.allows_draft_version(v)]
    if preferred in available and preferred not in allowed:
        trace.because(Reason.DRAFT_VERSION_NOT_ALLOWED, "speculation.draft_versions")
    if not allowed:
        if not quiet and preferred not in available:
            trace.because(Reason.DRAFT_VERSION_NOT_ALLOWED, "speculation.draft_versions")
        return None
    return preferred if preferred in allowed else allowed[0]


def _acceptance_and_cost(
    policy: TenantPolicy, ctx: DecisionContext, key: HistoryKey, trace: _Trace
) -> tuple[float, float]:
    """(a, c) from the tenant's history, else the global one, else the prior."""
    need = policy.auto.min_samples
    tenant = _usable(ctx.history.get(key))
    glob = _usable(ctx.global_history.get(key))
    if tenant is not None and tenant.samples >= need:
        source, a, c, n = "tenant", tenant.acceptance, tenant.c, tenant.samples
    elif glob is not None and glob.samples >= need:
        trace.because(Reason.COLD_START_GLOBAL, "auto.min_samples")
        source, a, c, n = "global", glob.acceptance, glob.c, glob.samples
    else:
        trace.because(Reason.COLD_START_PRIOR, "auto.prior")
        prior = policy.auto.priors[key[0]]
        source, a, c, n = "prior", prior.acceptance, prior.c, 0
    measured = ctx.load.draft_c.get(key[1]) if key[0] == "draft" and key[1] else None
    if measured is not None and math.isfinite(measured) and measured >= 0:
        trace.inputs["history_c"] = c
        c, c_source = measured, "measured_at_batch"
    else:
        c_source = source
    trace.inputs.update(
        proposer=key[0],
        draft_version=key[1],
        history_source=source,
        c_source=c_source,
        acceptance=a,
        c=c,
        samples=n,
        tenant_samples=tenant.samples if tenant is not None else 0,
    )
    return a, c


def _usable(entry: HistoryEntry | None) -> HistoryEntry | None:
    """Drop entries the cost model cannot use (NaN, out of range) instead of failing."""
    if entry is None or not (math.isfinite(entry.acceptance) and math.isfinite(entry.c)):
        return None
    if not 0.0 <= entry.acceptance <= 1.0 or entry.c < 0.0:
        return None
    return entry


def _resolve_auto(policy: TenantPolicy, ctx: DecisionContext, speedup: float, trace: _Trace) -> str:
    """Speculative iff S beats 1 + margin; hysteresis widens the band around the previous
    outcome so that an estimate hovering at the threshold does not flip the mode."""
    auto = policy.auto
    base = 1.0 + auto.margin
    previous = ctx.previous_mode
    if previous == "speculative":
        threshold, speculate = base - auto.hysteresis, speedup >= base - auto.hysteresis
    elif previous == "standard":
        threshold, speculate = base + auto.hysteresis, speedup > base + auto.hysteresis
    else:
        threshold, speculate = base, speedup > base
    trace.inputs.update(
        threshold=threshold,
        margin=auto.margin,
        hysteresis=auto.hysteresis,
        previous_mode=previous if previous in ("speculative", "standard") else None,
        probe_draw=ctx.probe_draw,
        probe_rate=auto.probe_rate,
    )
    if speculate != (speedup > base):
        trace.because(Reason.HYSTERESIS_HOLD, "auto.hysteresis")
    if speculate:
        trace.because(Reason.AUTO_SPECULATIVE, "auto")
        return "speculative"
    trace.because(Reason.AUTO_STANDARD, "auto")
    return "standard"


def _gates_force_standard(policy: TenantPolicy, ctx: DecisionContext, trace: _Trace) -> bool:
    """Rules that turn speculation off whatever the cost model says."""
    det, load = policy.determinism, policy.load
    forced = False
    trace.inputs["shed_queue_depth"] = load.shed_queue_depth
    if det.seed_forces_standard and ctx.request.seed is not None:
        forced |= trace.rule(det.enforcement, Reason.SEED_FORCES_STANDARD, "determinism")
    if not forced and ctx.load.queue_depth >= load.shed_queue_depth:
        forced |= trace.rule(load.enforcement, Reason.LOAD_SHED, "load")
    return forced
