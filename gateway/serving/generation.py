"""One request, one pipeline: authorize -> validate -> choose draft -> decide -> admit -> run
-> finish.

``GenerationService.start`` runs the first six steps, one call each, writes the admission
record (durable before the caller sends any byte: record first, act second) and returns the
started ``Generation``; the caller streams its deltas and then calls ``finish`` exactly
once (``refuse`` for a request that never started). ``finish`` is the one way back:
write the final audit record that completes the admission (durable before the caller sends
the last byte), settle the rate limit, feed the rollout guard, then the acceptance
history, in that order. Metrics and logs listen to the recorder.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gateway.database import Payload
from gateway.engine import (
    DecodeRequest,
    DecodeResult,
    Delta,
    EngineError,
    Finished,
    Grammar,
    KPrior,
)
from gateway.engine.constraints import ConstraintError
from gateway.serving.audit_map import (
    ServedRequest,
    admission_record,
    refused_record,
    served_record,
)
from gateway.serving.choices import merged_events, merged_result, seed_of
from gateway.serving.commands import Generate, Principal, RequestMeta
from gateway.serving.decisions import Plan, PolicyService
from gateway.serving.errors import STATUS_OF_KIND, GatewayError, invalid
from gateway.serving.fairness import FAIR_WAIT, RequestSlots, share_of
from gateway.serving.models import DraftHandle, ModelPool
from gateway.serving.outcome import Outcome
from gateway.serving.prepare import (
    Prepared,
    check_request_rate,
    helper_threads,
    note_admitted,
    prepare,
)
from gateway.serving.ratelimit import Limiter, Quota, Ticket
from gateway.serving.reasoning import grammar as thinking_first
from gateway.serving.reasoning import reasoning_tokens
from gateway.serving.reasoning import split as split_reasoning
from gateway.serving.recorder import Observed, Recorder
from gateway.serving.rollouts import RolloutTraffic
from gateway.serving.shown import Shown
from gateway.serving.suffix_store import SuffixStore
from gateway.serving.tool_output import ParsedCall, check_output, format_of, read_calls
from gateway.serving.tracing import RunTimings, Tracing, decision_attributes
from gateway.serving.worker import InferenceWorker, Job, Overloaded
from policies import Decision, Load

log = logging.getLogger("gateway.generation")


@dataclass
class Choice:
    """One of the request's n choices: its own decode row, grammar and output."""

    index: int
    job: Job
    grammar: Grammar | None
    result: DecodeResult | None = None
    text_parts: list[str] = field(default_factory=list)


@dataclass
class Generation:
    """A started request: decision made, engine runs (one per choice) queued on the
    inference worker."""

    meta: RequestMeta
    principal: Principal
    command: Generate
    prepared: Prepared
    plan: Plan
    quota: Quota
    ticket: Ticket
    draft: DraftHandle | None
    choices: list[Choice]
    service: GenerationService
    first_token_at: float | None = None
    finished: bool = False
    admission_id: int | None = None
    """The admission record's id (written before any output); None when none was written."""
    aborted: GatewayError | None = None
    """Why the request was ended from outside (admission unwritable, shutdown), if it was."""
    aborted_event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def result(self) -> DecodeResult | None:
        """The finished output: the one choice's result, or the choices' merged (tokens,
        counters) for usage and the audit record; None until every choice finished."""
        results = [c.result for c in self.choices]
        if any(r is None for r in results):
            return None
        return merged_result(results)  # type: ignore[arg-type]

    @property
    def completion_text(self) -> str:
        """What the audit record digests: the text, or the choices' texts as a JSON list."""
        texts = ["".join(c.text_parts) for c in self.choices]
        return texts[0] if len(texts) == 1 else json.dumps(texts, ensure_ascii=False)

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.prepared.prompt_ids

    @property
    def decision(self) -> Decision:
        return self.plan.decision

    @property
    def recorded_decision(self) -> Decision:
        """The decision as the audit record keeps it: with `fairness.waited` among its
        reasons when a row of this request was held back so that another tenant's ran first
        (the worker's fair admission, serving/fairness.py)."""
        d = self.plan.decision
        if any(c.job.fair_wait for c in self.choices):
            return replace(d, reason_codes=(*d.reason_codes, FAIR_WAIT))
        return d

    @property
    def mode(self) -> str:
        return str(self.plan.decision.mode)

    @property
    def draft_label(self) -> str | None:
        return f"{self.draft.entry.name}@{self.draft.entry.version}" if self.draft else None

    @property
    def calls_tools(self) -> bool:
        """The output is read as tool calls (tools sent, tool_choice other than none)."""
        return self.command.constraint == "tools"

    def tool_calls(self) -> list[ParsedCall]:
        """The calls the finished choices made, in choice order (none unless `calls_tools`)."""
        if not self.calls_tools:
            return []
        fmt = format_of(self.prepared.schema)
        texts = [self.answer(c.result.text) for c in self.choices if c.result]
        return [call for text in texts for call in read_calls(text, fmt)[1]]

    def reasoning_tokens(self) -> int:
        """Thinking tokens of the finished choices, the tags included (0: no thinking)."""
        thinks = self.prepared.reasoning
        return sum(reasoning_tokens(c.result.token_ids, thinks) for c in self.choices if c.result)

    def answer(self, text: str) -> str:
        """An output's answer: the text after a thinking model's thinking."""
        return split_reasoning(text, self.prepared.reasoning)[1]

    def headers(self) -> dict[str, str]:
        h = {
            **self.meta_headers(self.meta),
            "x-decision-id": self.plan.decision.decision_id,
            "x-decoding-mode": self.mode,
        }
        if self.draft_label:
            h["x-draft-model"] = self.draft_label
        return h

    @staticmethod
    def meta_headers(meta: RequestMeta) -> dict[str, str]:
        """The headers every answer carries, refusals too: request id and trace id."""
        h = {"x-request-id": meta.request_id}
        if meta.trace_id is not None:
            h["x-trace-id"] = meta.trace_id
        return h

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        """(choice index, text delta) as the engine emits them, the choices interleaved;
        afterwards every choice holds its result."""
        jobs = [c.job for c in self.choices]
        shown = Shown.of(self.prepared)  # structural special tokens written in (shown.py)
        try:
            async for index, event in merged_events(self.service.worker, jobs):
                choice = self.choices[index]
                if isinstance(event, Finished):
                    result = shown.result(event.result) if shown else event.result
                    await self._check_constraint(choice, result)
                    choice.result = result
                    continue
                if self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                event = shown.delta(index, event) if shown else event
                choice.text_parts.append(event.text)
                yield index, event
        except EngineError as exc:
            raise invalid(str(exc)) from exc
        except Overloaded as exc:  # queued past its tenant's share, evicted for another's
            raise overloaded(exc) from exc

    async def _check_constraint(self, choice: Choice, result: DecodeResult) -> None:
        """A grammar-complete output must validate before it is returned (defence in depth:
        the mask already guarantees it). Cut short (length, stop string): no claim is made.
        Validation runs off the event loop, within a time budget (tool_output.check_output)."""
        grammar = choice.grammar
        if self.prepared.compiled is None or grammar is None or not grammar.is_complete():
            return  # no response_format or tools (a thinking cap alone is no constraint)
        schema = self.prepared.schema
        tools = schema["tools"] if self.calls_tools and schema is not None else None
        try:
            async with helper_threads.hold(self.principal.tenant_id):
                await check_output(self.answer(result.text), schema, tools)
        except ConstraintError as exc:
            raise GatewayError(
                "internal",
                f"the output failed its schema validation: {exc}",
                code="constraint_violation",
            ) from exc

    async def collect(self) -> list[DecodeResult]:
        """Every choice's result, in choice order."""
        async for _ in self.deltas():
            pass
        return [c.result for c in self.choices if c.result is not None]

    def cancel(self) -> None:
        """Stop the engine runs at their next step (client gone, or an error)."""
        for c in self.choices:
            c.job.cancelled.set()

    def abort(self, error: GatewayError) -> None:
        """End the request from outside (shutdown, an unwritable admission): its engine runs
        stop at their next step and the caller answers and records ``error``."""
        if self.aborted is None:
            self.aborted = error
            self.aborted_event.set()
        self.cancel()

    def finish_detached(self, status: int, error: GatewayError | None = None) -> None:
        """finish() from a cancelled context (client disconnect, shutdown): runs in the
        background."""
        if not self.finished:
            self.service.recorder.detach(self.finish(status, error))

    async def finish(self, status: int = 200, error: GatewayError | None = None) -> None:
        """Write the final audit record, which completes the admission (durable on return).
        Call exactly once."""
        if not self.finished:
            self.finished = True
            await self.service.finish(self, Outcome(status=status, error=error))


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


def overloaded(exc: Overloaded) -> GatewayError:
    """The worker's refusal as the client's 503 (Retry-After from the worker)."""
    return GatewayError("overloaded", str(exc), code="overloaded", retry_after=exc.retry_after)
