"""OpenAI request bodies -> serving commands, with OpenAI's parameter rules (400s that name
the parameter), and quotas -> x-ratelimit-* headers."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from gateway.http.schemas import (
    ROLES,
    ChatCompletionRequest,
    CompletionRequest,
    ContentPart,
    Message,
    NamedToolChoice,
    TokenizeRequest,
)
from gateway.limits import MAX_PREDICTION_CHARS
from gateway.serving.commands import DecodingOverride, Generate, SamplingParams, Tools, ToolSpec
from gateway.serving.errors import invalid
from gateway.serving.ratelimit import Quota


def _text(content: str | list[ContentPart] | None, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise invalid(
                f"only text content parts are supported, got '{part.type}'", f"{param}[{i}].type"
            )
        parts.append(part.text)
    return "".join(parts)


def _joined_length(parts: list[ContentPart]) -> int:
    return sum(len(p.text) for p in parts if p.text is not None)


def _arguments(text: str, param: str) -> dict[str, Any]:
    """A call's arguments as the object the chat template renders."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid(f"the arguments are not valid JSON: {exc}", param) from None
    if not isinstance(value, dict):
        raise invalid("the arguments must be a JSON object", param)
    return value


def _messages(messages: list[Message]) -> tuple[dict[str, Any], ...]:
    """OpenAI messages -> the chat template's, with OpenAI's rules for tool messages: only
    an assistant message carries tool_calls, and each tool message answers a call of the
    assistant message before it (by tool_call_id)."""
    if not messages:
        raise invalid("messages must contain at least one message", "messages")
    out: list[dict[str, Any]] = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if m.role not in ROLES:
            raise invalid(f"unknown role '{m.role}'", f"{at}.role")
        role = "system" if m.role == "developer" else m.role
        message: dict[str, Any] = {"role": role, "content": _text(m.content, f"{at}.content")}
        if m.reasoning_content is not None and role == "assistant":  # as Qwen3's templates
            thought = _text(m.reasoning_content, f"{at}.reasoning_content")  # and gpt-oss's
            message["reasoning_content"] = message["thinking"] = thought  # name it
        if m.tool_calls is not None and role != "assistant":
            raise invalid("only assistant messages carry tool_calls", f"{at}.tool_calls")
        if (m.tool_call_id is not None) != (role == "tool"):
            raise invalid("a tool message needs tool_call_id (and only it)", f"{at}.tool_call_id")
        if role == "tool":
            if m.tool_call_id not in open_calls:
                raise invalid(
                    "a tool message must answer a tool call of the assistant message before it",
                    f"{at}.tool_call_id",
                )
            open_calls.discard(m.tool_call_id)  # type: ignore[arg-type]
            message["tool_call_id"] = m.tool_call_id
        else:
            open_calls = set()
        if m.tool_calls:
            open_calls = {c.id for c in m.tool_calls}
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": _arguments(
                            c.function.arguments, f"{at}.tool_calls[{j}].function.arguments"
                        ),
                    },
                }
                for j, c in enumerate(m.tool_calls)
            ]
        out.append(message)
    return tuple(out)


def _tools(body: ChatCompletionRequest) -> Tools | None:
    """tools, tool_choice, parallel_tool_calls -> Tools, with OpenAI's rules between them
    (the schemas themselves are checked when the grammar is built)."""
    if body.tools is None:
        for name in ("tool_choice", "parallel_tool_calls"):
            if getattr(body, name) is not None:
                raise invalid(f"{name} is only allowed when tools are specified", name)
        return None
    if body.response_format is not None and body.response_format.type != "text":
        raise invalid("response_format cannot be combined with tools", "response_format")
    specs, definitions = [], []
    for t in body.tools:
        f = t.function
        parameters = f.parameters if f.parameters is not None else {"type": "object"}
        specs.append(ToolSpec(f.name, parameters))
        function: dict[str, Any] = {"name": f.name, "parameters": parameters}
        if f.description is not None:
            function["description"] = f.description
        definitions.append({"type": "function", "function": function})
    choice, named = body.tool_choice or "auto", None
    if isinstance(choice, NamedToolChoice):
        named = choice.function.name
        if named not in {s.name for s in specs}:
            raise invalid(f"tool_choice names '{named}', which is not in tools", "tool_choice")
        choice = "named"
    parallel = True if body.parallel_tool_calls is None else body.parallel_tool_calls
    return Tools(tuple(specs), tuple(definitions), choice, named, parallel)


def _common(
    body: ChatCompletionRequest | CompletionRequest, max_tokens: int | None
) -> dict[str, Any]:
    # Ranges, lengths and counts are the structs' constraints (schemas.py), enforced when
    # the body is decoded; what is left here are the rules OpenAI's parameters carry.
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    top_k = body.top_k or 0
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if value not in (None, 0, 0.0):
            raise invalid(
                f"{name} is not supported (it would change the target distribution)", name
            )
    stop: tuple[str, ...] = ()
    if isinstance(body.stop, str):
        stop = (body.stop,)
    elif body.stop:
        stop = tuple(body.stop)
    bias = [(int(token), float(value)) for token, value in (body.logit_bias or {}).items()]
    prediction = None
    if body.prediction is not None:
        content = body.prediction.content
        joined = len(content) if isinstance(content, str) else _joined_length(content)
        if joined > MAX_PREDICTION_CHARS:  # the parts' count is capped by the schema, not this
            raise invalid(
                f"prediction.content has {joined} characters; at most {MAX_PREDICTION_CHARS} "
                "are allowed (the text parts joined)",
                "prediction",
            )
        prediction = _text(content, "prediction.content")
    decoding = None
    if body.decoding is not None:
        d = body.decoding
        decoding = DecodingOverride(
            mode=d.mode, proposer=d.proposer, k=d.k, open_objects=d.open_objects
        )
    response_format = None
    if body.response_format is not None and body.response_format.type != "text":
        rf = body.response_format
        response_format = {"type": rf.type}
        if rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema is None:
                raise invalid(
                    "response_format json_schema needs json_schema.schema",
                    "response_format.json_schema",
                )
            response_format["json_schema"] = {
                "name": rf.json_schema.name,
                "schema": rf.json_schema.schema,
                "strict": rf.json_schema.strict,
            }
    stream_options = body.stream_options
    if stream_options is not None and not body.stream:
        raise invalid("stream_options is only allowed when stream is true", "stream_options")
    return {
        "model": body.model,
        "max_tokens": max_tokens,
        "sampling": SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop=stop,
            seed=body.seed,
            logit_bias=tuple(bias),
        ),
        "prediction": prediction,
        "response_format": response_format,
        "decoding": decoding,
        "stream": bool(body.stream),
        "include_usage": bool(stream_options and stream_options.include_usage),
        "user": body.user,
        "n": body.n or 1,
    }


def to_command(body: ChatCompletionRequest | CompletionRequest) -> Generate:
    if isinstance(body, ChatCompletionRequest):
        max_tokens = body.max_completion_tokens or body.max_tokens
        top = body.top_logprobs or 0
        if top and not body.logprobs:
            raise invalid("top_logprobs requires logprobs to be true", "top_logprobs")
        return _with_logprobs(
            Generate(endpoint="chat.completions", messages=_messages(body.messages),
                     tools=_tools(body), **_common(body, max_tokens)),
            bool(body.logprobs),
            top,
        )  # fmt: skip
    if body.echo:
        raise invalid("echo is not supported", "echo")
    if body.suffix:
        raise invalid("suffix is not supported", "suffix")
    prompt = _prompt(body.prompt)
    n_lp = body.logprobs
    return _with_logprobs(
        Generate(endpoint="completions", prompt=prompt, **_common(body, body.max_tokens)),
        n_lp is not None,
        n_lp or 0,
    )


def _with_logprobs(cmd: Generate, logprobs: bool, top: int) -> Generate:
    sampling = replace(cmd.sampling, logprobs=logprobs, top_logprobs=top)
    return replace(cmd, sampling=sampling)


def _prompt(raw: str | list[Any]) -> str | tuple[int, ...]:
    def ids(items: list[Any]) -> tuple[int, ...] | None:
        ok = all(isinstance(t, int) and not isinstance(t, bool) for t in items)
        return tuple(items) if ok else None

    if isinstance(raw, str):
        return raw
    if raw and ids(raw) is not None:
        return tuple(raw)
    if len(raw) == 1 and isinstance(raw[0], str):
        return str(raw[0])
    if len(raw) == 1 and isinstance(raw[0], list) and (one := ids(raw[0])) is not None:
        return one
    raise invalid(
        "prompt must be a string or a list of token ids; send one prompt per request "
        "(batched prompts are not supported)",
        "prompt",
    )


def tokenize_command(body: TokenizeRequest) -> Generate:
    if body.messages is not None:
        return Generate(
            endpoint="chat.completions", model=body.model, messages=_messages(body.messages)
        )
    return Generate(endpoint="completions", model=body.model, prompt=body.prompt or "")


def _duration(seconds: float) -> str:
    return f"{max(0.0, seconds):.3f}s"


def ratelimit_headers(q: Quota) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": str(q.limit_requests),
        "x-ratelimit-remaining-requests": str(q.remaining_requests),
        "x-ratelimit-reset-requests": _duration(q.reset_requests_s),
        "x-ratelimit-limit-tokens": str(q.limit_tokens),
        "x-ratelimit-remaining-tokens": str(q.remaining_tokens),
        "x-ratelimit-reset-tokens": _duration(q.reset_tokens_s),
    }
