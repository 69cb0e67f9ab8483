"""Reasoning output over HTTP: a thinking model's `<think>…</think>` comes back apart from
its answer (`reasoning_content`, in full and streamed responses, which agree), a JSON schema
constrains the answer after the thinking, the tenant's `reasoning.max_tokens` caps the
thinking, and usage counts the thinking tokens.

The tiny random model has `<think>` and `</think>` as tokens and a chat template that speaks
of them (so the gateway treats it as a thinking model); a logit_bias on `<think>` makes it
open its thinking and keep writing `<think>` inside it, so only the cap ends the thinking."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import jsonschema
import pytest
import pytest_asyncio

from tests.integration import tiny_models
from tests.integration.service.harness import ADMIN, MODEL, Gateway, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

CAP = 5
# The demo ChatML template, with an assistant turn's thinking left out of the history (as
# thinking models' templates do).
TEMPLATE = "{#- the model thinks in <think>...</think> before it answers #}" + (
    tiny_models.CHAT_TEMPLATE.replace(
        "{% if m['content'] %}{{ m['content'] }}{% endif %}",
        "{% if m['content'] %}{{ m['content'].split('</think>')[-1].lstrip() }}{% endif %}",
    )
)
PERSON = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["age"],
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "Person", "schema": PERSON}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    assert TEMPLATE != tiny_models.CHAT_TEMPLATE and "</think>" in TEMPLATE
    root = tmp_path_factory.mktemp("models")
    manifest = tiny_models.build(root, extra_tokens=("<think>", "</think>"))
    for template in root.glob("*/chat_template.jinja"):
        template.write_text(TEMPLATE)
    var = tmp_path_factory.mktemp("var")
    async with running_gateway(manifest, f"sqlite+aiosqlite:///{var}/g.db", var) as g:
        doc = {"reasoning": {"max_tokens": CAP}}
        r = await g.client.put(f"/admin/policies/tenants/{g.tenant}", json=doc, headers=ADMIN)
        assert r.status_code == 200, r.text
        yield g


async def _token(gw: Gateway, text: str) -> int:
    r = await gw.client.post("/tokenize", json={"model": MODEL, "prompt": text}, headers=gw.auth)
    (token,) = r.json()["tokens"]
    return int(token)


async def _params(gw: Gateway, **extra) -> dict:  # type: ignore[no-untyped-def]
    bias = {str(await _token(gw, "<think>")): 100}
    return {"max_tokens": 60, "temperature": 0, "logit_bias": bias, **extra}


async def test_the_thinking_comes_apart_and_the_schema_holds_the_answer(gw: Gateway) -> None:
    r = await gw.chat(**await _params(gw, response_format=FORMAT), decoding={"mode": "standard"})
    assert r.status_code == 200, r.text
    body = r.json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "<think>" * CAP  # capped, then ended by force
    jsonschema.validate(json.loads(message["content"]), PERSON)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == CAP + 2
    record = next(x for x in await gw.records() if x["request_id"] == r.headers["x-request-id"])
    assert record["reasoning_tokens"] == CAP + 2  # in the audit record, hashed into the chain
    verify = await gw.client.get("/audit/verify", headers=ADMIN)
    assert verify.json()["ok"] is True


async def test_a_stream_carries_the_same_thinking_and_answer(gw: Gateway) -> None:
    params = await _params(gw, response_format=FORMAT)
    full = (await gw.chat(**params, decoding={"mode": "standard"})).json()
    r = await gw.chat(**params, decoding={"mode": "standard"}, stream=True,
                      stream_options={"include_usage": True})  # fmt: skip
    assert r.status_code == 200, r.text
    events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    deltas = [c["delta"] for e in events for c in e["choices"]]
    thought = "".join(d.get("reasoning_content") or "" for d in deltas)
    answer = "".join(d.get("content") or "" for d in deltas)
    message = full["choices"][0]["message"]
    assert (thought, answer) == (message["reasoning_content"], message["content"])
    assert all(not (d.get("reasoning_content") and d.get("content")) for d in deltas)
    usage = next(e["usage"] for e in events if e.get("usage"))
    assert usage["completion_tokens_details"]["reasoning_tokens"] == CAP + 2


async def test_speculation_keeps_the_thinking_and_the_answer(gw: Gateway) -> None:
    params = await _params(gw, response_format=FORMAT)
    std = await gw.chat(**params, decoding={"mode": "standard"})
    spec = await gw.chat(**params, decoding={"mode": "speculative", "proposer": "draft"})
    assert std.status_code == spec.status_code == 200, spec.text
    assert std.json()["choices"][0]["message"] == spec.json()["choices"][0]["message"]


async def test_without_a_constraint_the_cap_still_ends_the_thinking(gw: Gateway) -> None:
    r = await gw.chat(**await _params(gw), decoding={"mode": "standard"})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "<think>" * CAP  # the answer after it is free
    assert r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == CAP + 2


async def test_an_answer_without_thinking_has_no_reasoning(gw: Gateway) -> None:
    r = await gw.chat(max_tokens=8, temperature=0, decoding={"mode": "standard"})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message.get("reasoning_content") is None
    assert r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    record = next(x for x in await gw.records() if x["request_id"] == r.headers["x-request-id"])
    assert record["reasoning_tokens"] == 0  # a thinking model that did not think this time
