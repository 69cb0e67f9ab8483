"""One request = policy decision -> model pair -> engine run -> audit record.

``GenerationService.start`` checks the request against the model (tokens, context,
parameters), asks the decider how to decode, charges the tenant's rate limits and queues
the engine run on the inference worker. The returned ``Generation`` streams the engine's
deltas; ``finish`` writes the audit record (awaiting durability) before the caller sends
the last byte, so nothing is served unaudited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.engine import (
    DecodeRequest,
    DecodeResult,
    Delta,
    EngineError,
    Finished,
    Grammar,
    SamplingParams,
)
from gateway.engine.constraints.json_schema import (
    ConstraintError,
    compile_json_grammar,
    validate_output,
)
from gateway.serving.commands import Generate, Principal, RequestMeta
from gateway.serving.decisions import PolicyService
from gateway.serving.errors import GatewayError, invalid
from gateway.serving.models import ModelPool
from gateway.serving.outcome import Outcome
from gateway.serving.ratelimit import Quota, RateLimiter
from gateway.serving.recorder import Recorder
from gateway.serving.worker import InferenceWorker, Overloaded
from policies import RequestFeatures

DEFAULT_MAX_TOKENS = {"completions": 16, "chat.completions": 256}


@dataclass
class Generation:
    """A started request: decision made, engine run queued."""

    meta: RequestMeta
    principal: Principal
    command: Generate
    prompt_text: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    decision: Any
    quota: Quota
    draft_label: str | None
    _events: AsyncIterator[Any]
    _finish: Callable[[Generation, Outcome], Any]
    _cancel: Callable[[], None]
    _detach: Callable[[Any], None]
    grammar: Grammar | None = None
    schema: dict[str, Any] | None = None
    result: DecodeResult | None = None
    first_token_at: float | None = None
    finished: bool = False
    text_parts: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return str(self.decision.mode)

    def headers(self) -> dict[str, str]:
        h = {
            "x-request-id": self.meta.request_id,
            "x-decision-id": self.decision.decision_id,
            "x-decoding-mode": self.mode,
        }
        if self.draft_label:
            h["x-draft-model"] = self.draft_label
        return h

    async def deltas(self) -> AsyncIterator[Delta]:
        """The engine's text deltas; afterwards ``result`` holds the final result."""
        try:
            async for event in self._events:
                if isinstance(event, Finished):
                    self._check_constraint(event.result)
                    self.result = event.result
                    return
                if self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                self.text_parts.append(event.text)
                yield event
        except EngineError as exc:
            raise invalid(str(exc)) from exc

    def _check_constraint(self, result: DecodeResult) -> None:
        """A grammar-complete output must validate before it is returned (defence in depth:
        the mask already guarantees it). Cut short (length, stop string): no claim is made."""
        if self.grammar is None or not self.grammar.is_complete():
            return
        try:
            validate_output(result.text, self.schema)
        except ConstraintError as exc:
            raise GatewayError(
                "internal",
                f"the output failed its schema validation: {exc}",
                code="constraint_violation",
            ) from exc

    async def collect(self) -> DecodeResult:
        async for _ in self.deltas():
            pass
        assert self.result is not None
        return self.result

    def cancel(self) -> None:
        """Stop the engine run at its next step (client gone, or an error)."""
        self._cancel()

    def finish_detached(self, status: int) -> None:
        """finish() from a cancelled context (client disconnect): runs in the background."""
        if not self.finished:
            self._detach(self.finish(status))

    async def finish(self, status: int = 200, error: GatewayError | None = None) -> None:
        """Write the audit record (durable on return). Call exactly once."""
        if not self.finished:
            self.finished = True
            await self._finish(self, Outcome(status=status, error=error))


class GenerationService:
    def __init__(
        self,
        *,
        pool: ModelPool,
        worker: InferenceWorker,
        decider: PolicyService,
        limiter: RateLimiter,
        recorder: Recorder,
    ) -> None:
        self.pool = pool
        self.worker = worker
        self.decider = decider
        self.limiter = limiter
        self.recorder = recorder

    async def start(self, principal: Principal, meta: RequestMeta, cmd: Generate) -> Generation:
        if principal.role != "tenant" or principal.tenant_id is None:
            raise GatewayError("permission", "inference needs a tenant key", code="forbidden")
        self.recorder.check_writable()
        entry, engine = await self.pool.target(cmd.model)
        prompt_text, prompt_ids = tokenize(engine.tokenizer, cmd)
        budget = engine.context_length - len(prompt_ids)
        if not prompt_ids:
            raise invalid("the prompt is empty", param="messages" if cmd.messages else "prompt")
        if budget < 1:
            raise GatewayError(
                "context_length",
                f"This model's maximum context length is {engine.context_length} tokens; "
                f"the prompt has {len(prompt_ids)} tokens.",
                param="messages" if cmd.messages else "prompt",
                code="context_length_exceeded",
            )
        max_tokens = cmd.max_tokens or min(DEFAULT_MAX_TOKENS[cmd.endpoint], budget)
        if max_tokens > budget:
            raise GatewayError(
                "context_length",
                f"max_tokens ({max_tokens}) plus the prompt ({len(prompt_ids)} tokens) "
                f"exceeds the model's context length of {engine.context_length} tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        vocab = engine.target.vocab_size
        for token_id, _ in cmd.logit_bias:
            if not 0 <= token_id < vocab:
                raise invalid(
                    f"logit_bias token id {token_id} is not in [0, {vocab})", "logit_bias"
                )

        grammar, schema = await self._grammar(cmd, engine)
        o = cmd.decoding
        features = RequestFeatures(
            endpoint=cmd.endpoint,
            model=cmd.model,
            requested_mode=o.mode if o else None,
            requested_proposer=o.proposer if o else None,
            requested_k=o.k if o else None,
            max_tokens=max_tokens,
            temperature=cmd.temperature,
            top_p=cmd.top_p,
            seed=cmd.seed,
            has_prediction=cmd.prediction is not None,
            constraint=cmd.constraint,
            prompt_tokens=len(prompt_ids),
        )
        tenant = principal.tenant_id
        plan = await self.decider.decide(
            tenant, meta.request_id, features, self.pool.draft_versions(entry.name), self.worker
        )
        quota, ticket = self.limiter.admit(tenant, plan.limits, len(prompt_ids) + max_tokens)
        if not quota.allowed:
            raise GatewayError(
                "rate_limited",
                f"Rate limit reached for tenant {tenant}: {quota.limit_requests} requests/min, "
                f"{quota.limit_tokens} tokens/min. Retry after {quota.retry_after_s}s.",
                code="rate_limit_exceeded",
                retry_after=quota.retry_after_s,
            )
        draft_handle = None
        decision = plan.decision
        if decision.mode == "speculative" and decision.proposer == "draft":
            draft_handle = await self.pool.draft(entry.name, decision.draft_version)
        sampling = SamplingParams(
            temperature=cmd.temperature,
            top_p=cmd.top_p,
            top_k=cmd.top_k,
            max_tokens=max_tokens,
            stop=cmd.stop,
            seed=cmd.seed,
            logprobs=cmd.logprobs,
            top_logprobs=cmd.top_logprobs,
            logit_bias=cmd.logit_bias,
            allowed_token_ids=plan.allowed_token_ids,
            banned_token_ids=plan.banned_token_ids,
        )
        request = DecodeRequest(
            prompt_ids=prompt_ids,
            sampling=sampling,
            mode=decision.mode,
            proposer=decision.proposer if decision.mode == "speculative" else None,
            k_min=decision.k_min,
            k_max=decision.k_max,
            prediction=cmd.prediction,
            grammar=grammar,
        )
        draft_model = draft_handle.model if draft_handle else None
        try:
            job = self.worker.submit(
                lambda cancelled: engine.stream(request, draft_model, cancelled)
            )
        except Overloaded as exc:
            self.limiter.settle(ticket, 0)
            raise GatewayError(
                "overloaded", str(exc), code="overloaded", retry_after=exc.retry_after
            ) from exc

        async def finish(gen: Generation, outcome: Outcome) -> None:
            used = len(prompt_ids) + (len(gen.result.token_ids) if gen.result else 0)
            self.limiter.settle(ticket, used)
            await self.recorder.served(gen, entry, draft_handle, plan, outcome)

        draft_label = None
        if draft_handle is not None:
            draft_label = f"{draft_handle.entry.name}@{draft_handle.entry.version}"
        return Generation(
            meta=meta,
            principal=principal,
            command=cmd,
            prompt_text=prompt_text,
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            decision=decision,
            quota=quota,
            draft_label=draft_label,
            _events=self.worker.events(job),
            grammar=grammar,
            schema=schema,
            _finish=finish,
            _cancel=job.cancelled.set,
            _detach=self.recorder.detach,
        )

    async def _grammar(
        self, cmd: Generate, engine: Any
    ) -> tuple[Grammar | None, dict[str, Any] | None]:
        """response_format -> a fresh per-request grammar (compiled grammars are cached per
        schema hash); a bad schema or an unenforceable keyword is a 400 naming it."""
        rf = cmd.response_format
        if rf is None:
            return None, None
        schema = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else None
        try:
            compiled = await asyncio.to_thread(
                compile_json_grammar, engine.tokenizer, schema, engine.target.vocab_size
            )
        except ConstraintError as exc:
            raise invalid(str(exc), "response_format") from None
        return compiled.new(), schema


def tokenize(tokenizer: Any, cmd: Generate) -> tuple[str, tuple[int, ...]]:
    """The prompt as text (hashed into the audit record) and as token ids."""
    if cmd.messages is not None:
        try:
            text = tokenizer.apply_chat_template(
                list(cmd.messages), tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # jinja errors name the template problem
            raise invalid(f"cannot apply the chat template: {exc}", "messages") from exc
        return text, tuple(tokenizer.encode(text, add_special_tokens=False))
    if isinstance(cmd.prompt, tuple):
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for t in cmd.prompt):
            raise invalid(f"prompt token ids must be in [0, {vocab})", "prompt")
        return tokenizer.decode(list(cmd.prompt)), cmd.prompt
    text = cmd.prompt or ""
    return text, tuple(tokenizer.encode(text, add_special_tokens=False))
