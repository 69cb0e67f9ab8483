"""Request bodies in OpenAI's shapes (msgspec structs), decoded by the controllers so
that every malformed body becomes a 400 in OpenAI's error shape naming the parameter."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class Prediction(msgspec.Struct, kw_only=True):
    type: Literal["content"] = "content"
    content: str | list[ContentPart]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    name: str
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Decoding(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Gateway extension: how to decode (honoured when the tenant's policy allows it)."""

    mode: Literal["auto", "speculative", "standard"] = "auto"
    proposer: Literal["draft", "prompt_lookup", "prediction"] | None = None
    k: int | None = None


class _Common(msgspec.Struct, kw_only=True):
    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    prediction: Prediction | None = None
    decoding: Decoding | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None


class ChatCompletionRequest(_Common, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[Any]
    """A string, a list of token ids, or a one-element list of either."""
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    response_format: ResponseFormat | None = None


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str
    prompt: str | None = None
    messages: list[Message] | None = None


class TenantCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str
    name: str


class KeyCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    role: Literal["tenant", "auditor"] = "tenant"


def decode(body: bytes, kind: type[Any]) -> Any:
    """Decode a JSON body into ``kind``; raises ValueError(message, param) on bad input."""
    if not body:
        raise BodyError("the request body is empty; send a JSON object", None)
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        param = None
        if " - at `$." in text:
            param = text.rsplit(" - at `$.", 1)[1].rstrip("`")
        elif "missing required field" in text:
            param = text.split("`")[1] if "`" in text else None
        raise BodyError(text, param) from None
    except msgspec.DecodeError as exc:
        raise BodyError(f"the request body is not valid JSON: {exc}", None) from None


class BodyError(ValueError):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
