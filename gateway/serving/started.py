"""A started request (`Generation`): its n choices (`Choice`: a decode row each, with its
grammar and output), the deltas as the engine emits them, the output's checks and reads
(constraint validation, tool calls, thinking tokens), and its way to `finish`, which goes
back to the service that started it (generation.py `GenerationService`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gateway.engine import DecodeResult, Delta, EngineError, Finished, Grammar
from gateway.engine.constraints import ConstraintError
from gateway.serving.choices import merged_events, merged_result
from gateway.serving.commands import Generate, Principal, RequestMeta
from gateway.serving.decisions import Plan
from gateway.serving.errors import GatewayError, invalid
from gateway.serving.fairness import FAIR_WAIT
from gateway.serving.models import DraftHandle
from gateway.serving.outcome import Outcome
from gateway.serving.prepare import Prepared, helper_threads
from gateway.serving.ratelimit import Quota, Ticket
from gateway.serving.reasoning import reasoning_tokens
from gateway.serving.reasoning import split as split_reasoning
from gateway.serving.shown import Shown
from gateway.serving.tool_output import ParsedCall, check_output, format_of, read_calls
from gateway.serving.worker import Job, Overloaded
from policies import Decision

if TYPE_CHECKING:
    from gateway.serving.generation import GenerationService


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


def overloaded(exc: Overloaded) -> GatewayError:
    """The worker's refusal as the client's 503 (Retry-After from the worker)."""
    return GatewayError("overloaded", str(exc), code="overloaded", retry_after=exc.retry_after)
