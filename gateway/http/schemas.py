"""Request bodies in OpenAI's shapes (msgspec structs), decoded by the controllers so
that every malformed body becomes a 400 in OpenAI's error shape naming the parameter.

The constraints are msgspec ``Meta`` on the fields: the decoder enforces them and
/schema/openapi.json publishes the same ones (`gateway.http.contract` documents these
structs with msgspec's own JSON schema), so the document and the gateway cannot disagree.
A rule the serving layer words itself (the penalties, ``echo``) is documented with
``extra_json_schema`` and checked in `convert`."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from gateway.limits import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    MAX_CHOICES,
    MAX_K,
    MAX_MESSAGES,
    MAX_PREDICTION_CHARS,
    MAX_SCHEMA_DEPTH,
    MAX_STOP,
    MAX_TENANT_NAME,
    MAX_TEXT_CHARS,
    MAX_TOOL_CALLS,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    MAX_USER_CHARS,
)
from gateway.serving.admin import TENANT_ID

MAX_STOP_CHARS = 1_024
"""Longest stop string, in characters (at most MAX_STOP of them: 4,096 characters in all).
Every output row checks its text against them at each step (in time linear in the output,
engine/detok.py); a longer one is a 400 naming stop."""
Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
Int64 = Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)]
StopString = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=MAX_STOP_CHARS,
        description=f"1 to {MAX_STOP_CHARS} characters; at most {MAX_STOP} stop strings.",
    ),
]
TokenId = Annotated[str, Meta(pattern=r"^-?[0-9]{1,18}$", description="A token id, as text.")]
Bias = Annotated[float, Meta(ge=-100.0, le=100.0)]
ROLES = ("system", "developer", "user", "assistant", "tool")
"""Message roles served (developer is read as system)."""
STRICT = {"kw_only": True, "forbid_unknown_fields": True}
"""Every request struct: an argument the gateway does not implement is a 400 naming it."""
ONLY_ZERO = Meta(
    description="Not supported (it would change the target distribution): only 0.",
    extra_json_schema={"minimum": 0, "maximum": 0},
)


class ContentPart(msgspec.Struct, **STRICT):
    type: Annotated[str, Meta(description="Only 'text' parts are served.")]
    text: Text | None = None


Name = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="1 to 64 letters, digits, '_' or '-'.",
    ),
]
CallId = Annotated[str, Meta(min_length=1, max_length=256)]


class FunctionCall(msgspec.Struct, **STRICT):
    name: Name
    arguments: Annotated[str, Meta(max_length=MAX_TEXT_CHARS, description="A JSON object.")]


class ToolCall(msgspec.Struct, **STRICT):
    id: CallId
    type: Literal["function"]
    function: FunctionCall


class Message(msgspec.Struct, **STRICT):
    role: Annotated[
        str,
        Meta(
            description="system, developer (read as system), user, assistant or tool.",
            extra_json_schema={"enum": list(ROLES)},
        ),
    ]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: (
        Annotated[
            list[ToolCall],
            Meta(max_length=MAX_TOOL_CALLS, description="Assistant messages: calls it made."),
        ]
        | None
    ) = None
    tool_call_id: (
        Annotated[str, Meta(min_length=1, max_length=256, description="Tool messages only.")] | None
    ) = None
    refusal: Annotated[None, Meta(description="Accepted as null only.")] = None
    function_call: Annotated[None, Meta(description="Deprecated; null only.")] = None
    reasoning_content: (
        Annotated[
            Text,
            Meta(description="Assistant messages: their thinking, as a response returned it."),
        ]
        | None
    ) = None


class FunctionDef(msgspec.Struct, **STRICT):
    name: Name
    description: Annotated[str, Meta(max_length=MAX_TEXT_CHARS)] | None = None
    parameters: (
        Annotated[
            dict[str, Any],
            Meta(description="A JSON schema of type object (default: no arguments)."),
        ]
        | None
    ) = None
    strict: (
        Annotated[bool, Meta(description="Accepted; the arguments are always grammar-enforced.")]
        | None
    ) = None


class Tool(msgspec.Struct, **STRICT):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(msgspec.Struct, **STRICT):
    name: Name


class NamedToolChoice(msgspec.Struct, **STRICT):
    type: Literal["function"]
    function: NamedFunction


class Prediction(msgspec.Struct, **STRICT):
    type: Literal["content"] = "content"
    content: (
        Annotated[
            str,
            Meta(
                max_length=MAX_PREDICTION_CHARS,
                description="Expected output (OpenAI predicted outputs); a proposer drafts it.",
            ),
        ]
        | Annotated[
            list[ContentPart],
            Meta(
                max_length=MAX_PREDICTION_CHARS,
                description=f"Text parts; joined, at most {MAX_PREDICTION_CHARS} characters.",
            ),
        ]
    )


class StreamOptions(msgspec.Struct, **STRICT):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, **STRICT):
    name: str
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(msgspec.Struct, **STRICT):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Decoding(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Gateway extension: how to decode (honoured when the tenant's policy allows it)."""

    mode: Literal["auto", "speculative", "standard"] = "auto"
    proposer: Literal["draft", "prompt_lookup", "prediction", "suffix"] | None = None
    k: Annotated[int, Meta(ge=1, le=MAX_K, description="Draft tokens per step.")] | None = None
    open_objects: Annotated[
        bool,
        Meta(
            description="true: an object schema (response_format, tool parameters) that does "
            "not set additionalProperties lets the model add keys it does not name, as the "
            "letter of JSON Schema allows. Default false: only the named properties are "
            "generated, which is what framework-generated schemas mean."
        ),
    ] = False


class _Common(msgspec.Struct, **STRICT):
    model: str
    temperature: Annotated[float, Meta(ge=0.0, le=2.0, description="Default 1.")] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0, description="Default 1.")] | None = None
    top_k: Annotated[int, Meta(ge=0, le=INT32_MAX, description="0 = no cut.")] | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None
    stop: StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    seed: Int64 | None = None
    n: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=MAX_CHOICES,
                description="Choices per request, each decoded as its own batch row.",
            ),
        ]
        | None
    ) = None
    stream: bool | None = False
    stream_options: Annotated[StreamOptions, Meta(description="Only with stream: true.")] | None = (
        None
    )
    logit_bias: dict[TokenId, Bias] | None = None
    prediction: Prediction | None = None
    decoding: Decoding | None = None
    presence_penalty: Annotated[float, ONLY_ZERO] | None = None
    frequency_penalty: Annotated[float, ONLY_ZERO] | None = None
    user: (
        Annotated[
            str,
            Meta(
                max_length=MAX_USER_CHARS,
                description="End-user id; the audit record keeps its SHA-256 (filter: user).",
            ),
        ]
        | None
    ) = None


class ChatCompletionRequest(_Common, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None
    logprobs: bool | None = None
    top_logprobs: (
        Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS, description="Needs logprobs: true.")] | None
    ) = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Meta(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Common, kw_only=True):
    prompt: Annotated[
        Text | Annotated[list[int | Text | list[int]], Meta(min_length=1)],
        Meta(description="A string, a list of token ids, or a one-element list of either."),
    ]
    logprobs: Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: (
        Annotated[
            bool,
            Meta(description="Not supported: only false.", extra_json_schema={"enum": [False]}),
        ]
        | None
    ) = False
    suffix: (
        Annotated[
            str, Meta(description="Not supported: only empty.", extra_json_schema={"maxLength": 0})
        ]
        | None
    ) = None
    response_format: ResponseFormat | None = None


class TokenizeRequest(msgspec.Struct, **STRICT):
    """Exactly one of prompt or messages."""

    model: str
    prompt: Text | None = None
    messages: Annotated[list[Message], Meta(min_length=1, max_length=MAX_MESSAGES)] | None = None


class TenantCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: Annotated[
        str,
        Meta(
            description="Lower-case letters, digits, '_' and '-'; at most 63 characters.",
            extra_json_schema={"pattern": TENANT_ID.pattern},
        ),
    ]
    name: Annotated[
        str,
        Meta(
            max_length=MAX_TENANT_NAME,
            description="Display name (not blank).",
        ),
    ]


class KeyCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    role: Literal["tenant", "auditor"] = "tenant"
    expires_in_s: (
        Annotated[
            int,
            Meta(ge=1, le=10 * 365 * 86_400, description="Seconds until the key expires."),
        ]
        | None
    ) = None


_AT = re.compile(r" - at `(?:key` in `)?\$\.?(?P<path>[^`]*)`$")


def _param(message: str) -> str | None:
    """The parameter a msgspec error names: ``$.messages[0].role`` -> ``messages[0].role``, a
    missing field with its path; a dict's key or value (``$.logit_bias[...]``) names the dict."""
    found = _AT.search(message)
    at = found.group("path").replace("[...]", "") if found else ""
    if message.startswith("Object missing required field `"):
        field = message.split("`")[1]
        return f"{at}.{field}" if at else field
    return at or None


def decode(body: bytes, kind: type[Any]) -> Any:
    """Decode a JSON body into ``kind``; raises BodyError(message, param) on bad input."""
    if not body:
        raise BodyError("the request body is empty; send a JSON object", None)
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise BodyError(str(exc), _param(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise BodyError(f"the request body is not valid JSON: {exc}", None) from None
    except RecursionError:  # msgspec's depth guard (Python's recursion limit, ~1,000 levels)
        raise BodyError(
            "the request body's JSON is nested too deep to decode; response_format schemas "
            f"may nest at most {MAX_SCHEMA_DEPTH} objects and arrays",
            None,
        ) from None


class BodyError(ValueError):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
