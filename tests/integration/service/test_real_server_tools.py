"""Tool calling through the official openai client against a real `python -m gateway`
process: named, required, auto (a model biased to open a call) and none; streamed and not;
parallel calls; a conversation with tool results; every argument validates with jsonschema
against its tool's schema; speculative equals standard for the same greedy call; and an
argument the gateway does not implement is a 400 naming it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.integration import tiny_models
from tests.integration.service.harness import ADMIN, MODEL
from tests.integration.service.process import start_gateway

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
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
SCHEMAS = {"add": ADD, "weather": WEATHER}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": n, "parameters": s}} for n, s in SCHEMAS.items()
]
ASK = [{"role": "user", "content": "add 2 and 3"}]


@dataclass
class Server:
    url: str
    key: str
    proc: subprocess.Popen[bytes]
    tag: int

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    manifest = tiny_models.build(
        tmp_path_factory.mktemp("models"), context=2048, extra_tokens=("<tool_call>",)
    )
    var = tmp_path_factory.mktemp("server")
    proc, url, key = start_gateway(manifest, var)
    tokens = httpx.post(
        f"{url}/tokenize",
        json={"model": MODEL, "prompt": "<tool_call>"},
        headers={"authorization": f"Bearer {key}"},
    ).json()["tokens"]
    yield Server(url, key, proc, tokens[0])
    proc.terminate()
    proc.wait(timeout=60)


def _create(server: Server, **kw: Any) -> Any:
    args: dict[str, Any] = {"model": MODEL, "messages": ASK, "max_tokens": 80, "temperature": 0}
    return server.client().chat.completions.create(**{**args, **kw})


def _check(calls: Any) -> list[tuple[str, str]]:
    out = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        out.append((call.function.name, call.function.arguments))
    return out


def _streamed(server: Server, **kw: Any) -> tuple[list[tuple[str, str]], str | None]:
    calls: dict[int, list[str]] = {}
    reason = None
    for chunk in _create(server, stream=True, **kw):
        choice = chunk.choices[0]
        reason = choice.finish_reason or reason
        for d in choice.delta.tool_calls or []:
            if d.id is not None:
                calls[d.index] = [d.function.name, ""]
            calls[d.index][1] += d.function.arguments or ""
    return [(n, a) for n, a in (calls[i] for i in sorted(calls))], reason


def test_named_choice_streamed_and_not(server: Server) -> None:
    named = {"type": "function", "function": {"name": "weather"}}
    r = _create(server, tools=TOOLS, tool_choice=named, user="u-1")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = _check(choice.message.tool_calls)
    assert [n for n, _ in calls] == ["weather"]
    assert _streamed(server, tools=TOOLS, tool_choice=named) == (calls, "tool_calls")
    records = httpx.get(
        f"{server.url}/audit/records", params={"user": "u-1"}, headers=ADMIN
    ).json()["data"]
    assert [r["tool_names"] for r in records] == [["weather"]]


def test_required_with_and_without_parallel_calls(server: Server) -> None:
    for parallel in (True, False):
        r = _create(
            server, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel,
            max_tokens=160,
        )  # fmt: skip
        calls = r.choices[0].message.tool_calls
        complete = [
            c for c in calls if r.choices[0].finish_reason == "tool_calls" or c != calls[-1]
        ]
        _check(complete)
        assert parallel or len(calls) == 1


def test_auto_opens_a_call_when_the_model_writes_the_tag(server: Server) -> None:
    bias = {str(server.tag): 100}
    r = _create(server, tools=TOOLS[:1], logit_bias=bias)
    assert r.choices[0].finish_reason in ("tool_calls", "length")
    calls = r.choices[0].message.tool_calls
    _check(calls[:1])
    assert _streamed(server, tools=TOOLS[:1], logit_bias=bias)[0][:1] == _check(calls[:1])


def test_none_answers_text(server: Server) -> None:
    r = _create(server, tools=TOOLS, tool_choice="none", max_tokens=6)
    assert r.choices[0].message.tool_calls is None
    assert isinstance(r.choices[0].message.content, str)


def test_conversation_with_tool_results(server: Server) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    first = _create(server, tools=TOOLS, tool_choice=named).choices[0].message
    call = first.tool_calls[0]
    messages = [
        *ASK,
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    r = _create(server, messages=messages, tools=TOOLS, max_tokens=6)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # the same conversation as the client's own message object, unchanged
    r = _create(server, messages=[*ASK, first, messages[-1]], tools=TOOLS, max_tokens=6)
    assert r.usage is not None and r.usage.prompt_tokens > 0


def test_speculative_equals_standard_for_a_greedy_call(server: Server) -> None:
    out = []
    for mode in ("standard", "speculative"):
        raw = server.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=ASK, max_tokens=120, temperature=0, tools=TOOLS,
            tool_choice="required", extra_body={"decoding": {"mode": mode, "proposer": "draft"}},
        )  # fmt: skip
        assert raw.headers["x-decoding-mode"] == mode
        out.append(
            [
                (c.function.name, c.function.arguments)
                for c in raw.parse().choices[0].message.tool_calls
            ]
        )
    assert out[0] == out[1]


def test_unimplemented_arguments_are_400s_naming_them(server: Server) -> None:
    for kw, param in (
        ({"store": True}, "store"),
        ({"metadata": {"a": "b"}}, "metadata"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"extra_body": {"guided_json": {}}}, "guided_json"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    ):
        with pytest.raises(openai.BadRequestError) as exc:
            _create(server, **kw)
        assert exc.value.param == param, exc.value.body
