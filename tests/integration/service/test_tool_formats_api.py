"""Every tool-call format over a real `python -m gateway` process, through the official
openai client: one tiny target per family, each with a chat template modelled on that
family's (tests/integration/tool_families.py, gpt-oss's harmony among them), and one whose
manifest declares its format.

The families' tags are tokens, special ones (hidden from the output's text) where the
family's tokenizer has them so. For each: a named call and parallel required calls valid
against their schemas; the streamed deltas assembling to the full response's calls;
speculative (a random draft, so tokens are rejected) equal to standard for the same greedy
call; auto mode opening a call when the model writes the format's own opening; and a
conversation whose assistant calls and tool results the family's template renders in the
family's own syntax."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from gateway.engine.constraints.tool_formats import FORMATS
from tests.integration import tool_families
from tests.integration.service.process import tenant_key
from tests.integration.tool_families import SPECIAL_TAGS

ADD = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": -9, "maximum": 999},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["c", "f"]},
        "hourly": {"type": "boolean"},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
SCHEMAS = {"add": ADD, "weather": WEATHER}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()
]
ASK = [{"role": "user", "content": "add 2 and 3"}]
FAMILIES = [*tool_families.TEMPLATES, "declared"]
OPENING = {
    "hermes": "<tool_call>",
    "llama3_json": "<|python_tag|>",
    "mistral": "[TOOL_CALLS]",
    "mistral_v11": "[TOOL_CALLS]",
    "granite": "<|tool_call|>",
    "pythonic": "[",
    "harmony": "<|channel|>commentary",
    "declared": "[TOOL_CALLS]",
}
"""What a model writes to open a call in auto mode (biased to, in the test)."""
# How each family's template renders the conversation's call (add with a=.., b=..) and
# its result "5": the family's own syntax, found in the prompt the gateway builds.
RENDERED = {
    "hermes": ('<tool_call>\n{"name": "add", "arguments": {"a": ', "<tool_response>\n5\n"),
    "llama3_json": ('{"name": "add", "parameters": {"a": ', "ipython<|end_header_id|>\n\n5"),
    "mistral": (
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": ',
        '{"content": "5", "call_id": "',
    ),
    "mistral_v11": ('[TOOL_CALLS]add[ARGS]{"a": ', "[TOOL_RESULTS]5[/TOOL_RESULTS]"),
    "granite": (
        '<|tool_call|>[{"name": "add", "arguments": {"a": ',
        "tool_response<|end_of_role|>5",
    ),
    "pythonic": ("[add(a=", "ipython<|header_end|>\n\n5"),
    "harmony": (
        '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": ',
        '<|start|>functions.add to=assistant<|channel|>commentary<|message|>"5"<|end|>',
    ),
    "declared": ('<tool_call>\n{"name":"add","arguments":{"a":', "<|im_start|>tool\n5"),
}


@dataclass
class Server:
    url: str
    key: str
    root: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0)

    def tokens(self, model: str, **body: Any) -> list[int]:
        r = httpx.post(
            f"{self.url}/tokenize",
            json={"model": model, **body},
            headers={"authorization": f"Bearer {self.key}"},
        )
        assert r.status_code == 200, r.text
        return r.json()["tokens"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def server(tool_families_gateway: tuple[str, Path]) -> Server:
    url, root = tool_families_gateway  # shared with test_langchain.py (conftest.py)
    key = tenant_key(url, "tool-formats")
    tool_families.cap_thinking(url, "tool-formats")  # gpt-oss's analysis ends
    return Server(url, key, root)


def _model(family: str) -> str:
    return tool_families.DECLARED if family == "declared" else tool_families.target(family)


def _format(family: str) -> str:
    return "mistral" if family == "declared" else family


def _create(server: Server, family: str, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "model": _model(family), "messages": ASK, "max_tokens": 120, "temperature": 0,
    }  # fmt: skip
    return server.client().chat.completions.create(**{**args, **kw})


def _check(family: str, calls: Any) -> list[tuple[str, str]]:
    out = []
    for call in calls:
        assert call.type == "function"
        if FORMATS[_format(family)].id_length:  # Mistral's templates take 9 letters/digits
            assert len(call.id) == 9 and call.id.isalnum(), call.id
        else:
            assert call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        out.append((call.function.name, call.function.arguments))
    return out


def _streamed(server: Server, family: str, **kw: Any) -> tuple[list[tuple[str, str]], Any]:
    calls: dict[int, list[str]] = {}
    reason = None
    for chunk in _create(server, family, stream=True, **kw):
        choice = chunk.choices[0]
        reason = choice.finish_reason or reason
        for d in choice.delta.tool_calls or []:
            if d.id is not None:
                assert d.index not in calls and d.function.arguments == ""
                calls[d.index] = [d.function.name, ""]
            calls[d.index][1] += d.function.arguments or ""
    return [(n, a) for n, a in (calls[i] for i in sorted(calls))], reason


@pytest.mark.parametrize("family", FAMILIES)
def test_named_call_full_and_streamed(server: Server, family: str) -> None:
    named = {"type": "function", "function": {"name": "weather"}}
    choice = _create(server, family, tools=TOOLS, tool_choice=named).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = _check(family, choice.message.tool_calls)
    assert [n for n, _ in calls] == ["weather"]
    assert _streamed(server, family, tools=TOOLS, tool_choice=named) == (calls, "tool_calls")


@pytest.mark.parametrize("family", FAMILIES)
def test_required_parallel_calls_full_and_streamed(server: Server, family: str) -> None:
    kw = {"tools": TOOLS, "tool_choice": "required", "max_tokens": 200}
    choice = _create(server, family, **kw).choices[0]
    calls = choice.message.tool_calls
    complete = calls if choice.finish_reason == "tool_calls" else calls[:-1]
    full = [(c.function.name, c.function.arguments) for c in calls]
    _check(family, complete)
    assert len(calls) >= 1
    assert _streamed(server, family, **kw) == (full, choice.finish_reason)
    one = _create(server, family, parallel_tool_calls=False, **kw).choices[0]
    assert len(one.message.tool_calls) == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_speculative_equals_standard_for_a_greedy_call(server: Server, family: str) -> None:
    out = []
    for mode in ("standard", "speculative"):
        raw = server.client().chat.completions.with_raw_response.create(
            model=_model(family), messages=ASK, max_tokens=120, temperature=0, tools=TOOLS,
            tool_choice="required", extra_body={"decoding": {"mode": mode, "proposer": "draft"}},
        )  # fmt: skip
        assert raw.headers["x-decoding-mode"] == mode
        calls = raw.parse().choices[0].message.tool_calls
        out.append([(c.function.name, c.function.arguments) for c in calls])
        if mode == "speculative":
            assert raw.headers["x-draft-model"].startswith(_model(family) + "-draft@")
    assert out[0] == out[1] and out[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_opens_a_call_on_the_formats_own_opening(server: Server, family: str) -> None:
    bias = {str(t): 100 for t in server.tokens(_model(family), prompt=OPENING[family])}
    choice = _create(server, family, tools=TOOLS[:1], logit_bias=bias).choices[0]
    calls = choice.message.tool_calls
    assert calls and choice.message.content is None, choice
    _check(family, calls[:1])
    streamed = _streamed(server, family, tools=TOOLS[:1], logit_bias=bias)[0]
    assert streamed[:1] == _check(family, calls[:1])
    # without tools the same bias is plain text: nothing is read as a call (a special
    # token's text is not shown: Llama's, Mistral's and Granite's tags)
    text = _create(server, family, logit_bias=bias, max_tokens=3).choices[0].message
    assert text.tool_calls is None
    if family != "harmony":  # there a header without its message is no text
        assert text.content.startswith(OPENING[family]) or OPENING[family] in SPECIAL_TAGS


@pytest.mark.parametrize("family", FAMILIES)
def test_conversation_renders_calls_and_results_in_the_familys_syntax(
    server: Server, family: str
) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    first = _create(server, family, tools=TOOLS, tool_choice=named).choices[0].message
    call = first.tool_calls[0]
    messages = [
        *ASK,
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    r = _create(server, family, messages=messages, tools=TOOLS, max_tokens=6)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the client's own message object, unchanged, renders the same
    r = _create(server, family, messages=[*ASK, first, messages[-1]], tools=TOOLS, max_tokens=6)
    assert r.usage is not None and r.usage.prompt_tokens > 0
    ids = server.tokens(_model(family), messages=messages)  # the gateway templates it
    tokenizer = AutoTokenizer.from_pretrained(server.root / f"{_model(family)}-target")
    prompt = tokenizer.decode(ids)
    rendered_call, rendered_result = RENDERED[family]
    assert rendered_call in prompt and rendered_result in prompt, prompt[-400:]
    if family == "mistral":  # Mistral v0.3's result names its call (v11's does not)
        assert call.id in prompt
