"""OpenAI request bodies -> serving commands, with OpenAI's parameter rules (400s that name
the parameter), and quotas -> x-ratelimit-* headers."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gateway.http.schemas import (
    ROLES,
    ChatCompletionRequest,
    CompletionRequest,
    ContentPart,
    Message,
    TokenizeRequest,
)
from gateway.serving.commands import DecodingOverride, Generate, SamplingParams
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


def _messages(messages: list[Message]) -> tuple[dict[str, str], ...]:
    if not messages:
        raise invalid("messages must contain at least one message", "messages")
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise invalid(f"unknown role '{m.role}'", f"messages[{i}].role")
        role = "system" if m.role == "developer" else m.role
        out.append({"role": role, "content": _text(m.content, f"messages[{i}].content")})
    return tuple(out)


def _common(
    body: ChatCompletionRequest | CompletionRequest, max_tokens: int | None
) -> dict[str, Any]:
    if body.n not in (None, 1):
        raise invalid("n > 1 is not supported: this gateway returns one choice per request", "n")
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
        prediction = _text(body.prediction.content, "prediction.content")
    decoding = None
    if body.decoding is not None:
        d = body.decoding
        decoding = DecodingOverride(mode=d.mode, proposer=d.proposer, k=d.k)
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
    }


def to_command(body: ChatCompletionRequest | CompletionRequest) -> Generate:
    if isinstance(body, ChatCompletionRequest):
        max_tokens = body.max_completion_tokens or body.max_tokens
        top = body.top_logprobs or 0
        if top and not body.logprobs:
            raise invalid("top_logprobs requires logprobs to be true", "top_logprobs")
        return _with_logprobs(
            Generate(endpoint="chat.completions", messages=_messages(body.messages),
                     **_common(body, max_tokens)),
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
