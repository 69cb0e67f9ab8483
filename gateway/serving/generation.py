"""One request, one pipeline: authorize -> validate -> choose draft -> decide -> admit -> run
-> finish.

``GenerationService.start`` runs the first six steps, one call each, writes the admission
record (durable before the caller sends any byte: record first, act second) and returns the
started ``Generation``; the caller streams its deltas and then calls ``finish`` exactly
once (``refuse`` for a request that never started). ``finish`` is the one way back:
write the final audit record that completes the admission (durable before the caller sends
the last byte), settle the rate limit, feed the rollout guard, then the acceptance
history, in that order. Metrics and logs listen to the recorder. The started request
itself (its choices, deltas and output): started.py.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gateway.database import Payload
from gateway.engine import DecodeRequest, KPrior
from gateway.serving.audit_map import (
    ServedRequest,
    admission_record,
    refused_record,
    served_record,
)
from gateway.serving.choices import seed_of
from gateway.serving.commands import Generate, Principal, RequestMeta
from gateway.serving.decisions import Plan, PolicyService
from gateway.serving.errors import STATUS_OF_KIND, GatewayError
from gateway.serving.fairness import RequestSlots, share_of
from gateway.serving.models import DraftHandle, ModelPool
from gateway.serving.outcome import Outcome
from gateway.serving.prepare import Prepared, check_request_rate, note_admitted, prepare
from gateway.serving.ratelimit import Limiter, Quota, Ticket
from gateway.serving.reasoning import grammar as thinking_first
from gateway.serving.recorder import Observed, Recorder
from gateway.serving.rollouts import RolloutTraffic
from gateway.serving.started import Choice, Generation, overloaded
from gateway.serving.suffix_store import SuffixStore
from gateway.serving.tracing import RunTimings, Tracing, decision_attributes
from gateway.serving.worker import InferenceWorker, Overloaded
from policies import Load

log = logging.getLogger("gateway.generation")
COST_K = 16  # verify costs handed to the policy for k = 0..16 (extrapolated past)


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """The services a request passes through, one or more steps each (module docstring)."""

    pool: ModelPool
    """The loaded models: the target's engine and the drafts."""
    worker: InferenceWorker
    """Runs the decode rows."""
    policy: PolicyService
    """Decides the decoding and the limits; learns from the outcome."""
    traffic: RolloutTraffic
    """The rollouts' split of draft versions; the guard's samples."""
    limiter: Limiter
    """The tenants' rate limits."""
    recorder: Recorder
    """The audit records and their listeners (metrics, request log)."""
    tracing: Tracing = field(default_factory=lambda: Tracing(None))
    """The spans to make (default none)."""


class GenerationService:
    def __init__(
        self,
        pipeline: Pipeline,
        *,
        prefix_cache: bool = True,
        slots: RequestSlots | None = None,
        suffix: SuffixStore | None = None,
    ) -> None:
        self.slots = slots or RequestSlots()  # each tenant's requests in flight, capped
        self.suffix = suffix or SuffixStore()  # each tenant's texts, for proposer "suffix"
        self.prefix_cache = prefix_cache  # rows reuse their tenant's kept prompt prefixes
        self.tracing = pipeline.tracing
        self.pool = pipeline.pool
        self.worker = pipeline.worker
        self.policy = pipeline.policy
        self.traffic = pipeline.traffic
        self.limiter = pipeline.limiter
        self.recorder = pipeline.recorder

    async def start(self, principal: Principal, meta: RequestMeta, cmd: Generate) -> Generation:
        tenant = self._authorize(principal)  # 1. a tenant key; the audit store writable
        check_request_rate(self.limiter, self.policy, tenant)  # its window known full: 429
        cap = self.policy.fairness_for(tenant).max_concurrent_requests
        self.slots.check(tenant, cap)  # at its requests in flight: 429 before any work
        prepared = await prepare(self.pool, cmd, tenant)  # 2. prompt (off the loop), grammar
        with self.tracing.span("gateway.policy.decide") as span:
            preferred = self.traffic.choose(  # 3. the rollout's draft version, if any
                cmd.model, meta.request_id, tenant, self.policy.allows_draft_version(tenant)
            )
            load = self._load(prepared)
            plan = self.policy.decide(  # 4. mode, proposer, draft version, k, limits
                tenant, prepared.features, self.pool.draft_versions(prepared.entry.name),
                preferred, load,
            )  # fmt: skip
            if span is not None:
                drafts = self.pool.manifest.drafts_for(prepared.entry.name)
                span.set_attributes(
                    decision_attributes(plan.decision, load, prepared.entry, drafts)
                )
        quota, ticket = await self._admit(
            tenant, plan, prepared, cmd.n
        )  # 5. the tenant's rate limits
        note_admitted(self.limiter, tenant, quota)  # a full window refuses the next at 1.
        draft, choices = await self._run(cmd, prepared, plan, ticket, tenant)  # 6. queue
        gen = Generation(
            meta, principal, cmd, prepared, plan, quota, ticket, draft, choices, self
        )  # fmt: skip
        await self._record_admission(gen)  # 7. durable before any output byte leaves
        return gen

    async def _record_admission(self, gen: Generation) -> None:
        """Record first, act second: the admission is durable before the caller sends a
        byte (its write overlaps the prefill the worker has begun). Fail-closed, a failed
        write aborts the request: ``gen.aborted`` is set, its runs stop at their next step,
        and the caller answers the error and finishes the request (the one way back)."""
        admission = admission_record(
            meta=gen.meta, principal=gen.principal, decision=gen.plan.decision,
            target=gen.prepared.entry, draft=gen.draft.entry if gen.draft else None,
            prompt_text=gen.prepared.prompt_text, prompt_tokens=len(gen.prompt_ids),
        )  # fmt: skip
        try:
            attrs = {"gateway.request_id": gen.meta.request_id}
            with self.tracing.span("gateway.audit.admit", attrs):
                gen.admission_id = await self.recorder.admit(admission, gen.abort)
        except GatewayError as err:
            gen.abort(err)
        except asyncio.CancelledError:  # cancelled while writing: nobody reads the runs
            gen.cancel()
            gen.finish_detached(499)
            raise
        except Exception as exc:  # a bug: the caller answers 500 and finishes once
            log.exception("the admission write failed", exc_info=exc)
            gen.abort(GatewayError("internal", "internal error; the x-request-id names it"))

    async def finish(self, gen: Generation, outcome: Outcome) -> None:
        """7. The one way back, in order: audit record, limits, rollout guard, history."""
        self.slots.release(gen.principal.tenant_id)
        result = gen.result
        completion = gen.completion_text
        served = ServedRequest(
            meta=gen.meta,
            principal=gen.principal,
            cmd=gen.command,
            decision=gen.recorded_decision,
            target=gen.prepared.entry,
            draft=gen.draft.entry if gen.draft else None,
            prompt_text=gen.prepared.prompt_text,
            prompt_tokens=len(gen.prompt_ids),
            result=result,
            completion_text=completion,
            first_token_at=gen.first_token_at,
            tool_names=tuple(c.name for c in gen.tool_calls()),
            admission_id=gen.admission_id,
            reasoning_tokens=gen.reasoning_tokens() if gen.prepared.reasoning else None,
        )
        record = served_record(served, outcome)
        payload = None
        if gen.plan.retention_days > 0:
            payload = Payload(gen.prepared.prompt_text, completion, gen.plan.retention_days)
        jobs = [c.job for c in gen.choices]
        self.tracing.run(jobs, [c.result.stats if c.result else None for c in gen.choices])
        used = len(gen.prompt_ids) + (len(result.token_ids) if result else 0)
        try:
            attrs = {"gateway.request_id": record.request_id}
            with self.tracing.span("gateway.audit.write", attrs):
                await self.recorder.record(  # raises when fail-closed
                    record, payload, result, timings=RunTimings.of_jobs(jobs)
                )
        finally:  # after the record: a settle cut short (client gone) cannot lose it
            await self.limiter.settle(gen.ticket, used)
        await self.traffic.observe(record, result)
        self.recorder.detach(self.policy.observe(gen.plan, result))
        if outcome.error is None:
            self._remember(gen)

    def _remember(self, gen: Generation) -> None:
        """A served request's prompt and outputs into its tenant's suffix index, when the
        tenant's policy may use proposer "suffix" (others keep nothing)."""
        tenant = gen.principal.tenant_id
        if tenant is None or "suffix" not in self.policy.proposers_for(tenant):
            return
        for c in gen.choices:
            if c.result is not None and c.result.token_ids:
                self.suffix.record(tenant, gen.prepared.entry.name, gen.prompt_ids,
                                   c.result.token_ids)  # fmt: skip

    async def refuse(
        self, principal: Principal | None, meta: RequestMeta, cmd: Generate | None,
        error: GatewayError,
    ) -> None:  # fmt: skip
        """The audit record of a request refused before it ran (the client gets `error`
        whether or not this write succeeds). A caller that did not authenticate (no
        principal: no key, a wrong, revoked or expired one) is not chained: anyone could
        grow the audit table with such calls. The listeners still see its record (metrics
        count it as gateway_unauthenticated_requests_total, the request log has its line)."""
        record = refused_record(meta, principal, cmd, STATUS_OF_KIND[error.kind], error)
        if principal is None:
            for listener in self.recorder.listeners:
                listener(Observed(record))
            return
        await self.recorder.record(record, None, None, best_effort=True)

    # -- the steps ------------------------------------------------------------------------

    def _load(self, prepared: Prepared) -> Load:
        """The load the decision assumes: the batch this request would join (its rows and
        the forward costs measured there, see Engine.cost_at) and the queue."""
        w, engine = self.worker, prepared.engine
        rows = max(1, min(w.max_batch, w.depth + 1))
        cost = engine.cost_at(rows, COST_K)
        draft_c: dict[str, float] = {}
        for version, model in self.pool.loaded_draft_models(prepared.entry.name).items():
            measured = engine.cost_at(rows, 0, model)
            if measured is not None and measured.draft_c is not None:
                draft_c[version] = measured.draft_c
        return Load(
            queue_depth=w.depth, capacity=w.capacity, batch_rows=rows,
            verify_cost=cost.verify if cost is not None else (),
            draft_c=MappingProxyType(draft_c),
        )  # fmt: skip

    def _authorize(self, principal: Principal) -> str:
        if principal.role != "tenant" or principal.tenant_id is None:
            raise GatewayError("permission", "inference needs a tenant key", code="forbidden")
        self.recorder.check_writable()
        return principal.tenant_id

    async def _admit(
        self, tenant: str, plan: Plan, prepared: Prepared, n: int
    ) -> tuple[Quota, Ticket]:
        budget = len(prepared.prompt_ids) + prepared.max_tokens * n
        quota, ticket = await self.limiter.admit(tenant, plan.limits, budget)
        if not quota.allowed:
            raise GatewayError(
                "rate_limited",
                f"Rate limit reached for tenant {tenant}: {quota.limit_requests} requests/min, "
                f"{quota.limit_tokens} tokens/min. Retry after {quota.retry_after_s}s.",
                code="rate_limit_exceeded",
                retry_after=quota.retry_after_s,
            )
        return quota, ticket

    async def _run(
        self, cmd: Generate, prepared: Prepared, plan: Plan, ticket: Ticket, tenant: str
    ) -> tuple[DraftHandle | None, list[Choice]]:
        """Queue one decode row per choice (rows of one target batch together); choice i > 0
        gets its own grammar and, when seeded, the seed + i. With the prefix cache on, each
        row may reuse the tenant's kept prompt prefixes (engine/batch/prefix.py)."""
        decision = plan.decision
        speculative = decision.mode == "speculative"
        draft = None
        choices: list[Choice] = []
        share = share_of(tenant, plan.fairness)
        try:
            self.slots.acquire(tenant, plan.fairness.max_concurrent_requests)
        except GatewayError:
            await self.limiter.settle(ticket, 0)
            raise
        try:
            if speculative and decision.proposer == "draft":
                assert decision.draft_version is not None
                draft = await self.pool.draft(prepared.entry.name, decision.draft_version)
            suffix = None
            if speculative and decision.proposer == "suffix":
                suffix = self.suffix.source(tenant, prepared.entry.name)
            for i in range(cmd.n):
                grammar = prepared.grammar
                if i and prepared.compiled is not None:
                    grammar = prepared.compiled.new()
                # a thinking model: the grammar constrains the answer, the policy caps the thinking
                grammar = thinking_first(grammar, prepared.reasoning, plan.reasoning_budget)
                request = DecodeRequest(
                    prompt_ids=prepared.prompt_ids,
                    sampling=replace(
                        cmd.sampling,
                        max_tokens=prepared.max_tokens,
                        allowed_token_ids=plan.allowed_token_ids,
                        banned_token_ids=plan.banned_token_ids,
                        seed=seed_of(cmd.sampling.seed, i),
                    ),
                    mode="speculative" if speculative else "standard",
                    proposer=decision.proposer if speculative else None,  # type: ignore[arg-type]
                    k_min=decision.k_min,
                    k_max=decision.k_max,
                    tree=decision.tree,
                    prediction=cmd.prediction,
                    grammar=grammar,
                    k_prior=_k_prior(plan),
                    may_pause=decision.auto_outcome is not None,  # auto: off where it won't pay
                    cache_scope=tenant if self.prefix_cache else None,
                    suffix_source=suffix,
                )
                model = draft.model if draft else None
                job = self.worker.submit_decode(prepared.engine, request, model, share)
                choices.append(Choice(i, job, grammar))
        except Overloaded as exc:
            await self._abandon(choices, ticket, tenant)
            raise overloaded(exc) from exc
        except BaseException:
            await self._abandon(choices, ticket, tenant)
            raise
        return draft, choices

    async def _abandon(self, choices: list[Choice], ticket: Ticket, tenant: str) -> None:
        self.slots.release(tenant)
        for c in choices:
            c.job.cancelled.set()
        await self.limiter.settle(ticket, 0)


def _k_prior(plan: Plan) -> KPrior | None:
    """The decision's acceptance and c: where the engine's k policy starts."""
    d = plan.decision
    if d.acceptance is None or d.c is None:
        return None
    return KPrior(acceptance=d.acceptance, c=d.c)
