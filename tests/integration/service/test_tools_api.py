"""Tool calling and the strict surface over HTTP (Litestar's client, tiny models, SQLite):
forced calls validate against their schemas, streamed deltas rebuild the full response,
multi-turn conversations render, bad tools and unknown arguments are 400s naming the
parameter, and the audit record carries the user digest and the tool names."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

from gateway.database import sha256_text
from tests.integration import tiny_models
from tests.integration.service.harness import ADMIN, MODEL, Gateway, sqlite_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "sum", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
USER = [{"role": "user", "content": "weather in Paris?"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """The tiny pair with a 2,048-token context (the template's tool list is long in a
    320-token vocabulary) and the opening tag as one token, so a logit_bias can make the
    model open a call."""
    manifest = tiny_models.build(
        tmp_path_factory.mktemp("models"), context=2048, extra_tokens=("<tool_call>",)
    )
    async with sqlite_gateway(manifest, tmp_path_factory.mktemp("var")) as g:
        yield g


async def _chat(gw: Gateway, **body: Any) -> Any:
    body = {"model": MODEL, "messages": USER, "max_tokens": 96, "temperature": 0, **body}
    return await gw.client.post("/v1/chat/completions", json=body, headers=gw.auth)


def _error(r: Any) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    return r.json()["error"]  # type: ignore[no-any-return]


def _valid_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message["tool_calls"]
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        args = json.loads(call["function"]["arguments"])
        jsonschema.validate(args, SCHEMAS[call["function"]["name"]])
    return calls  # type: ignore[no-any-return]


NAMED = {"type": "function", "function": {"name": "add"}}


async def test_named_tool_choice_forces_a_valid_call(gw: Gateway) -> None:
    r = await _chat(gw, tools=TOOLS, tool_choice=NAMED, user="alice")
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["content"] is None
    calls = _valid_calls(choice["message"])
    assert [c["function"]["name"] for c in calls] == ["add"]
    rec = (await gw.records(user="alice"))[0]
    assert rec["constraint"] == "tools" and rec["tool_names"] == ["add"]
    assert rec["tool_calls"] == 1 and rec["user_sha256"] == sha256_text("alice")
    assert await gw.records(user="bob") == []


@pytest.mark.parametrize("parallel", [False, True])
async def test_required_calls_one_or_more_tools(gw: Gateway, parallel: bool) -> None:
    r = await _chat(gw, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    calls = _valid_calls(choice["message"])
    assert len(calls) >= 1 and (parallel or len(calls) == 1)
    assert choice["finish_reason"] in ("tool_calls", "length")


async def test_stream_deltas_rebuild_the_full_response(gw: Gateway) -> None:
    body = {"tools": TOOLS, "tool_choice": "required", "max_tokens": 200}
    full = (await _chat(gw, **body)).json()["choices"][0]
    r = await _chat(gw, stream=True, **body)
    assert r.status_code == 200, r.text
    calls: dict[int, dict[str, Any]] = {}
    reason = None
    for line in r.text.split("\n"):
        if not line.startswith("data: {"):
            continue
        choice = json.loads(line[6:])["choices"][0]
        reason = choice["finish_reason"] or reason
        for d in choice["delta"].get("tool_calls", []):
            if "id" in d:  # the first delta of a call: id, type and the whole name
                assert d["index"] not in calls and d["function"]["arguments"] == ""
                calls[d["index"]] = {"id": d["id"], "type": d["type"], "function": d["function"]}
            else:
                assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
                calls[d["index"]]["function"]["arguments"] += d["function"]["arguments"]
    streamed = [calls[i] for i in sorted(calls)]
    assert [c["function"] for c in streamed] == [
        c["function"] for c in full["message"]["tool_calls"]
    ]
    assert [c["id"][:5] for c in streamed] == ["call_"] * len(streamed)
    assert reason == full["finish_reason"]


async def test_none_and_auto_without_a_call_answer_text(gw: Gateway) -> None:
    for choice in ("none", "auto"):
        r = await _chat(gw, tools=TOOLS, tool_choice=choice, max_tokens=8)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert "tool_calls" not in message and isinstance(message["content"], str)


async def test_auto_constrains_a_call_the_model_opens(gw: Gateway) -> None:
    """logit_bias makes the model write the opening tag first; from there the grammar forces
    a call of a listed tool with valid arguments, then only more calls or the end."""
    tok = await gw.client.post(
        "/tokenize", json={"model": MODEL, "prompt": "<tool_call>"}, headers=gw.auth
    )
    (tag,) = tok.json()["tokens"]
    r = await _chat(gw, tools=TOOLS[1:], logit_bias={str(tag): 100}, max_tokens=64)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    calls = _valid_calls(choice["message"])
    assert calls[0]["function"]["name"] == "add"
    assert choice["message"]["content"] is None
    # the same bias without tools: the tag is plain text, nothing is parsed as a call
    r = await _chat(gw, logit_bias={str(tag): 100}, max_tokens=4)
    assert r.json()["choices"][0]["message"]["content"].startswith("<tool_call>")


async def test_multi_turn_with_tool_results(gw: Gateway) -> None:
    first = (await _chat(gw, tools=TOOLS, tool_choice=NAMED)).json()["choices"][0]["message"]
    call = first["tool_calls"][0]
    messages = [
        *USER,
        first,
        {"role": "tool", "tool_call_id": call["id"], "content": "42"},
    ]
    r = await _chat(gw, messages=messages, tools=TOOLS, max_tokens=4)
    assert r.status_code == 200, r.text
    tok = await gw.client.post(
        "/tokenize", json={"model": MODEL, "messages": messages}, headers=gw.auth
    )
    assert tok.status_code == 200, tok.text


async def test_speculative_equals_standard_for_a_greedy_call(gw: Gateway) -> None:
    out = []
    for mode in ("standard", "speculative"):
        r = await _chat(
            gw, tools=TOOLS, tool_choice="required", max_tokens=120,
            decoding={"mode": mode, "proposer": "draft", "k": 4},
        )  # fmt: skip
        assert r.status_code == 200 and r.headers["x-decoding-mode"] == mode, r.text
        out.append(r.json()["choices"][0]["message"]["tool_calls"])
    strip = [[c["function"] for c in calls] for calls in out]
    assert strip[0] == strip[1]


BAD_SCHEMA = {"type": "object", "properties": {"x": {"type": "strin"}}}


def _fn(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", **function}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [TOOLS[0], _fn(parameters=BAD_SCHEMA)]}, "tools[1].function.parameters"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": [_fn(parameters={"type": "string"})]}, "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
         "tools[0].function.name"),
        ({"tools": []}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
        ({"store": True}, "store"),
        ({"functions": []}, "functions"),
        ({"messages": [{"role": "user", "content": "x", "audio": None}]}, "messages[0].audio"),
        ({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]},
         "tools[0].function.x"),
        ({"messages": [{"role": "tool", "content": "1", "tool_call_id": "c"}]},
         "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": "1", "tool_calls": []}]},
         "messages[0].tool_calls"),
    ],
)  # fmt: skip
async def test_bad_tools_and_unknown_arguments_are_400s(
    gw: Gateway, body: dict[str, Any], param: str
) -> None:
    err = _error(await _chat(gw, **body))
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"


async def test_every_endpoint_refuses_unknown_arguments(gw: Gateway) -> None:
    r = await gw.client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": "x", "best_of": 2},
        headers=gw.auth,
    )
    assert _error(r)["param"] == "best_of"
    r = await gw.client.post(
        "/tokenize", json={"model": MODEL, "prompt": "x", "add_special": 1}, headers=gw.auth
    )
    assert _error(r)["param"] == "add_special"
    r = await gw.client.get("/audit/records", params={"tenannt": "a"}, headers=ADMIN)
    assert _error(r)["param"] == "tenannt"
    r = await gw.client.get("/v1/models", params={"limit": "2"}, headers=gw.auth)
    assert _error(r)["param"] == "limit"
    r = await gw.client.post(
        "/admin/policies/resolve", json={"tenant": gw.tenant, "dry": True}, headers=ADMIN
    )
    assert _error(r)["param"] == "dry"
