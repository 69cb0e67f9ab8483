"""Step 2 of the pipeline: a command checked against its model, as what the policy may know.

``prepare`` tokenizes the prompt, checks it and max_tokens against the context, checks
logit_bias ids against the vocabulary, compiles the response_format grammar (cached per
schema) and builds the ``RequestFeatures`` the policy decides on, once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gateway.engine import Engine, Grammar
from gateway.engine.constraints.json_schema import (
    CompiledGrammar,
    ConstraintError,
    compile_json_grammar,
)
from gateway.engine.constraints.tool_calls import (
    ToolError,
    ToolMode,
    check_tools,
    compile_tool_grammar,
)
from gateway.limits import DEFAULT_MAX_TOKENS
from gateway.serving.commands import Generate
from gateway.serving.errors import GatewayError, invalid
from gateway.serving.models import ModelPool
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


async def prepare(pool: ModelPool, cmd: Generate) -> Prepared:
    entry, engine = await pool.target(cmd.model)
    prompt_text, prompt_ids = tokenize(engine.tokenizer, cmd)
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
    compiled, schema = await _grammar(cmd, engine)
    return Prepared(
        entry, engine, prompt_text, prompt_ids, max_tokens,
        compiled.new() if compiled else None, schema,
        features(cmd, len(prompt_ids), max_tokens), compiled,
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
    cmd: Generate, engine: Engine
) -> tuple[CompiledGrammar | None, dict[str, Any] | None]:
    """response_format or tools -> a fresh per-request grammar (compiled grammars are cached
    per schema hash); a bad schema or an unenforceable keyword is a 400 naming it. Compiling
    uses no torch, so it runs in a helper thread, off the inference thread."""
    if cmd.tools is not None:
        t = cmd.tools
        mode: ToolMode = "auto" if t.choice == "auto" else "required"
        parallel = t.parallel and t.choice != "named"  # a named choice is one call
        try:
            check_tools(t.specs)  # every tool, also those the choice leaves out
            if not t.callable:
                return None, None
            compiled = await asyncio.to_thread(
                compile_tool_grammar, engine.tokenizer, t.callable, mode, parallel,
                engine.target.vocab_size,
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
