"""Step 2 of the pipeline: a command checked against its model, as what the policy may know.

``prepare`` tokenizes the prompt, checks it and max_tokens against the context, checks
logit_bias ids against the vocabulary, compiles the response_format grammar (cached per
schema) and builds the ``RequestFeatures`` the policy decides on, once.

Nothing here runs unbounded work on the event loop: first cheap checks of the raw prompt
(MAX_PROMPT_CHARS; `check_fits`: more characters than the context could hold), before any
templating, then templating, tokenization and the grammar's compile in helper threads (the
Rust tokenizers, jinja and llguidance need no torch; the inference thread is the only one
that runs torch), at most TOKENIZING_PER_TENANT of one tenant's at a time (`helper_threads`,
which the output's validation also waits for) (the tenant's further requests wait for
their own turn, so one tenant cannot fill the helper threads). /tokenize goes through the
same path, after `admit_tokenize` charged the tenant a request. Before all of it,
`check_request_rate` refuses a tenant whose request window an earlier admission filled.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any, Final

from gateway.engine import Engine, Grammar
from gateway.engine.constraints import (
    CompiledGrammar,
    ConstraintError,
    ToolError,
    ToolMode,
    check_tools,
    compile_json_grammar,
    compile_tool_grammar,
    named_properties_only,
)
from gateway.limits import DEFAULT_MAX_TOKENS
from gateway.serving.commands import Generate
from gateway.serving.decisions import PolicyService
from gateway.serving.errors import GatewayError, invalid
from gateway.serving.models import ModelPool
from gateway.serving.ratelimit import Limiter, Quota, Ticket
from gateway.serving.reasoning import Reasoning, thinks
from gateway.serving.reasoning import detect as detect_reasoning
from models_registry.manifest import ModelEntry
from policies import RequestFeatures


@dataclass(frozen=True)
class Prepared:
    """A request checked against its target model."""

    entry: ModelEntry
    engine: Engine
    prompt_text: str
    """The prompt as text (chat template applied): hashed into the audit record."""
    prompt_ids: tuple[int, ...]
    max_tokens: int
    grammar: Grammar | None
    schema: dict[str, Any] | None
    features: RequestFeatures
    compiled: CompiledGrammar | None = None
    """What ``grammar`` was made from: each further choice (n > 1) gets its own."""
    reasoning: Reasoning | None = None
    """How the model thinks before it answers (chat requests to a thinking model)."""


MAX_PROMPT_CHARS: Final = 1_048_576
"""Most characters of one request's prompt before templating: the prompt, or every
message's text, tool-call arguments and tool definitions together (1 MiB; each text is
capped at MAX_TEXT_CHARS too). Checked before the tokenizer runs; the context length
refuses far less once tokenized, this only bounds the templating and tokenizing work."""
TOKENIZING_PER_TENANT: Final = 2
"""One tenant's work in the helper threads at the same time at most: prompts templated and
tokenized, grammars compiled, outputs validated (its further requests wait, other tenants'
do not, so one tenant cannot take every helper thread)."""


class TenantGate:
    """At most ``per_tenant`` holders per tenant at once; the rest of that tenant wait."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._slots: dict[str, tuple[asyncio.Semaphore, int]] = {}  # tenant -> (sem, users)

    @asynccontextmanager
    async def hold(self, tenant: str | None) -> AsyncIterator[None]:
        key = tenant or ""
        sem, users = self._slots.get(key) or (asyncio.Semaphore(self.per_tenant), 0)
        self._slots[key] = (sem, users + 1)
        try:
            async with sem:
                yield
        finally:
            sem, users = self._slots[key]
            if users == 1:
                del self._slots[key]
            else:
                self._slots[key] = (sem, users - 1)


helper_threads = TenantGate(TOKENIZING_PER_TENANT)


def prompt_chars(cmd: Generate) -> int:
    """Characters of the prompt before templating (cheap: no tokenizer, no template): the
    messages' text (an assistant's thinking too), their tool calls' arguments and the tool
    definitions the template presents."""
    if cmd.messages is not None:
        total = sum(len(json.dumps(d)) for d in cmd.tools.definitions) if cmd.tools else 0
        for m in cmd.messages:
            content = m.get("content")
            total += len(content) if isinstance(content, str) else 0
            total += len(m.get("reasoning_content") or "")  # an assistant's thinking sent back
            for call in m.get("tool_calls") or ():
                total += len(str(call.get("function", {}).get("arguments", "")))
        return total
    if isinstance(cmd.prompt, str):
        return len(cmd.prompt)
    return len(cmd.prompt or ())


def check_prompt_size(cmd: Generate) -> None:
    """400 naming messages / prompt when the raw prompt is over MAX_PROMPT_CHARS."""
    chars = prompt_chars(cmd)
    if chars > MAX_PROMPT_CHARS:
        raise invalid(
            f"the prompt has {chars} characters before templating; at most "
            f"{MAX_PROMPT_CHARS} are allowed",
            "messages" if cmd.messages is not None else "prompt",
        )


_token_chars: dict[int, tuple[Any, int]] = {}  # id(tokenizer) -> (tokenizer, longest token)


def max_token_chars(tokenizer: Any) -> int:
    """Characters one token covers at most: its longest vocabulary entry (byte-level BPE
    spells each byte as one character, so a token covers no more characters than that).
    Computed once per tokenizer (call it off the event loop the first time)."""
    hit = _token_chars.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
    _token_chars[id(tokenizer)] = (tokenizer, max(1, longest))  # the ref keeps the id unique
    return max(1, longest)


def check_fits(cmd: Generate, tokenizer: Any, context_length: int) -> None:
    """The cheap context check before tokenizing: a prompt of more characters than the
    context's tokens times the longest token cannot fit (templating only adds text);
    token ids are counted as they are. The exact check follows tokenizing."""
    chars = prompt_chars(cmd)
    per_token = 1 if isinstance(cmd.prompt, tuple) else max_token_chars(tokenizer)
    if chars > context_length * per_token:
        raise GatewayError(
            "context_length",
            f"This model's maximum context length is {context_length} tokens; the prompt "
            f"has {chars} {'tokens' if per_token == 1 else 'characters'}, more than "
            f"{context_length * per_token} could fit (a token covers at most {per_token}).",
            param="messages" if cmd.messages is not None else "prompt",
            code="context_length_exceeded",
        )


async def tokenize_off_loop(
    tokenizer: Any, cmd: Generate, tenant: str | None, context_length: int | None = None
) -> tuple[str, tuple[int, ...]]:
    """`tokenize` after the cheap checks (raw size; with ``context_length``, whether it can
    fit), in a helper thread, within the tenant's share of them."""
    check_prompt_size(cmd)
    if context_length is not None:
        if id(tokenizer) not in _token_chars:
            await asyncio.to_thread(max_token_chars, tokenizer)
        check_fits(cmd, tokenizer, context_length)
    async with helper_threads.hold(tenant):
        return await asyncio.to_thread(tokenize, tokenizer, cmd)


@dataclass
class _Full:
    until: float  # time.monotonic() when the window's oldest request leaves it
    limit: int  # the requests/min it was full at


_full_windows: weakref.WeakKeyDictionary[Any, dict[str, _Full]] = weakref.WeakKeyDictionary()


def note_admitted(limiter: Limiter, tenant: str, quota: Quota) -> None:
    """After an admission (or a refusal): when the tenant's request window is full, remember
    until when the window stays full (no request leaves it before its oldest does), so that
    `check_request_rate` refuses the next ones before any templating."""
    full = _full_windows.setdefault(limiter, {})
    if quota.remaining_requests == 0 and quota.reset_requests_s > 0:
        full[tenant] = _Full(time.monotonic() + quota.reset_requests_s, quota.limit_requests)
    else:
        full.pop(tenant, None)


def check_request_rate(limiter: Limiter, policy: PolicyService, tenant: str) -> None:
    """The cheap admission check before a request costs anything: a 429 while this
    process's last admission left the tenant's request window full (and the tenant's limit
    has not been raised since). Without such a note the limiter decides after tokenizing."""
    full = _full_windows.get(limiter, {})
    hit = full.get(tenant)
    if hit is None:
        return
    left = hit.until - time.monotonic()
    if left <= 0 or policy.limits_for(tenant).requests_per_minute > hit.limit:
        full.pop(tenant, None)
        return
    retry = math.ceil(left)
    raise GatewayError(
        "rate_limited",
        f"Rate limit reached for tenant {tenant}: {hit.limit} requests/min. Retry after {retry}s.",
        code="rate_limit_exceeded",
        retry_after=retry,
    )


async def admit_tokenize(
    limiter: Limiter, policy: PolicyService, tenant: str
) -> tuple[Quota, Ticket]:
    """Charge one /tokenize call to the tenant's request rate limit and, once its prompt is
    tokenized, its tokens (``limiter.settle(ticket, len(ids))``): tokenizing a large prompt
    holds the interpreter lock for a while, so tokens/min bounds how often a tenant can ask
    for it. A tenant with no token left (or over its request rate) gets the 429 a
    generation would get."""
    check_request_rate(limiter, policy, tenant)
    quota, ticket = await limiter.admit(tenant, policy.limits_for(tenant), 1)
    note_admitted(limiter, tenant, quota)
    if not quota.allowed:
        raise GatewayError(
            "rate_limited",
            f"Rate limit reached for tenant {tenant}: {quota.limit_requests} requests/min. "
            f"Retry after {quota.retry_after_s}s.",
            code="rate_limit_exceeded",
            retry_after=quota.retry_after_s,
        )
    return quota, ticket


async def prepare(pool: ModelPool, cmd: Generate, tenant: str | None = None) -> Prepared:
    """``tenant``: whose share of the tokenizing threads the prompt waits for."""
    check_prompt_size(cmd)  # before anything costs
    entry, engine = await pool.target(cmd.model)
    prompt_text, prompt_ids = await tokenize_off_loop(
        engine.tokenizer, cmd, tenant, engine.context_length
    )
    param = "messages" if cmd.messages else "prompt"
    budget = engine.context_length - len(prompt_ids)
    if not prompt_ids:
        raise invalid("the prompt is empty", param=param)
    if budget < 1:
        raise GatewayError(
            "context_length",
            f"This model's maximum context length is {engine.context_length} tokens; "
            f"the prompt has {len(prompt_ids)} tokens.",
            param=param,
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
    for token_id, _ in cmd.sampling.logit_bias:
        if not 0 <= token_id < vocab:
            raise invalid(f"logit_bias token id {token_id} is not in [0, {vocab})", "logit_bias")
    async with helper_threads.hold(tenant):
        compiled, schema = await _grammar(cmd, engine, entry.tool_format)
        thinking = None
        if cmd.messages is not None and thinks(engine.tokenizer):  # the first call per
            # tokenizer reads its vocabulary, so it runs in a helper thread
            thinking = await asyncio.to_thread(detect_reasoning, engine.tokenizer, prompt_text)
    return Prepared(
        entry, engine, prompt_text, prompt_ids, max_tokens,
        compiled.new() if compiled else None, schema,
        features(cmd, len(prompt_ids), max_tokens), compiled, thinking,
    )  # fmt: skip


def features(cmd: Generate, prompt_tokens: int, max_tokens: int) -> RequestFeatures:
    """What the policy may know about the request (never its text)."""
    o, sp = cmd.decoding, cmd.sampling
    return RequestFeatures(
        endpoint=cmd.endpoint,
        model=cmd.model,
        requested_mode=o.mode if o else None,
        requested_proposer=o.proposer if o else None,
        requested_k=o.k if o else None,
        max_tokens=max_tokens,
        temperature=sp.temperature,
        top_p=sp.top_p,
        seed=sp.seed,
        has_prediction=cmd.prediction is not None,
        constraint=cmd.constraint,
        prompt_tokens=prompt_tokens,
    )


async def _grammar(
    cmd: Generate, engine: Engine, tool_format: str | None = None
) -> tuple[CompiledGrammar | None, dict[str, Any] | None]:
    """response_format or tools -> a fresh per-request grammar (compiled grammars are cached
    per schema hash); a bad schema or an unenforceable keyword is a 400 naming it. Compiling
    uses no torch, so it runs in a helper thread, off the inference thread."""
    named = cmd.decoding is None or not cmd.decoding.open_objects
    if cmd.tools is not None:
        t = cmd.tools
        mode: ToolMode = "auto" if t.choice == "auto" else "required"
        parallel = t.parallel and t.choice != "named"  # a named choice is one call
        try:
            # every tool, also those the choice leaves out; its regexes compile off the loop
            await asyncio.to_thread(check_tools, t.specs)
            if not t.callable:
                return None, None
            specs = t.callable
            if named:
                specs = tuple(replace(s, parameters=named_properties_only(s.parameters))
                              for s in specs)  # fmt: skip
            compiled = await asyncio.to_thread(
                compile_tool_grammar, engine.tokenizer, specs, mode, parallel,
                engine.target.vocab_size, tool_format,
            )  # fmt: skip
        except ToolError as exc:
            where = "tools" if exc.index is None else f"tools[{exc.index}].function.{exc.field}"
            raise invalid(str(exc), where) from None
        return compiled, compiled.schema
    rf = cmd.response_format
    if rf is None:
        return None, None
    schema = rf["json_schema"]["schema"] if rf["type"] == "json_schema" else None
    try:
        if schema is not None and named:
            schema = named_properties_only(schema)
        compiled = await asyncio.to_thread(
            compile_json_grammar, engine.tokenizer, schema, engine.target.vocab_size
        )
    except ConstraintError as exc:
        raise invalid(str(exc), "response_format") from None
    return compiled, schema


def tokenize(tokenizer: Any, cmd: Generate) -> tuple[str, tuple[int, ...]]:
    """The prompt as text (hashed into the audit record) and as token ids."""
    if cmd.messages is not None:
        try:
            tools = list(cmd.tools.definitions) if cmd.tools else None
            text = tokenizer.apply_chat_template(
                list(cmd.messages), tools=tools, tokenize=False, add_generation_prompt=True
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
