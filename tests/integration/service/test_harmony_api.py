"""gpt-oss's harmony channels over HTTP: the analysis message comes back as
`reasoning_content` and the final message as the content (in full and streamed responses,
which agree), a JSON schema holds the final answer, the tenant's `reasoning.max_tokens`
ends the analysis, usage and the audit record count the thinking's tokens, and a client
may send an assistant message back with its thinking, which the template renders.

The tiny random model has harmony's markers as special tokens (hidden from the engine's
text, as in gpt-oss's tokenizer), ``<|return|>`` and ``<|call|>`` among its end tokens and
a template modelled on gpt-oss's (tests/integration/tool_families.py). A logit_bias on the
first token of ``analysis`` makes it open an analysis message and keep writing that token
inside it, so only the cap ends the thinking; one on the first token of ``final`` makes it
answer at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import jsonschema
import pytest
import pytest_asyncio
from transformers import AutoTokenizer

from tests.integration import tiny_models, tool_families
from tests.integration.service.harness import ADMIN, MODEL, Gateway, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

CAP = 5
PERSON = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["age"],
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "Person", "schema": PERSON}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    root = tmp_path_factory.mktemp("models")
    manifest = tiny_models.build(root, context=1024, extra_tokens=tool_families.HARMONY)
    for folder in root.glob("*-v*"):
        data = json.loads((folder / "tokenizer.json").read_text())
        for token in data["added_tokens"]:
            if token["content"] in tool_families.HARMONY:
                token.update(special=True, normalized=False)
        (folder / "tokenizer.json").write_text(json.dumps(data))
        (folder / "chat_template.jinja").write_text(tool_families.GPT_OSS)
        tool_families.end_harmony_outputs(folder)
    var = tmp_path_factory.mktemp("var")
    async with running_gateway(manifest, f"sqlite+aiosqlite:///{var}/g.db", var) as g:
        doc = {"reasoning": {"max_tokens": CAP}}
        r = await g.client.put(f"/admin/policies/tenants/{g.tenant}", json=doc, headers=ADMIN)
        assert r.status_code == 200, r.text
        g.root = root  # type: ignore[attr-defined]
        yield g


async def _tokens(gw: Gateway, **body: object) -> list[int]:
    r = await gw.client.post("/tokenize", json={"model": MODEL, **body}, headers=gw.auth)
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


async def _params(gw: Gateway, word: str, **extra: object) -> dict:  # type: ignore[type-arg]
    first = (await _tokens(gw, prompt=word))[0]
    return {"max_tokens": 60, "temperature": 0, "logit_bias": {str(first): 100}, **extra}


async def _word(gw: Gateway, word: str) -> str:
    tok = AutoTokenizer.from_pretrained(gw.root / "tiny-target-v1")  # type: ignore[attr-defined]
    return str(tok.decode([(await _tokens(gw, prompt=word))[0]]))


async def test_the_analysis_comes_apart_and_the_schema_holds_the_final_answer(
    gw: Gateway,
) -> None:
    params = await _params(gw, "analysis", response_format=FORMAT)
    r = await gw.chat(**params, decoding={"mode": "standard"})
    assert r.status_code == 200, r.text
    body = r.json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == await _word(gw, "analysis") * CAP
    jsonschema.validate(json.loads(message["content"]), PERSON)
    assert body["choices"][0]["finish_reason"] == "stop"
    header = len(await _tokens(gw, prompt="<|channel|>analysis<|message|>"))
    thinking = header + CAP + 1  # the header, the capped thinking, <|end|>
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == thinking
    record = next(x for x in await gw.records() if x["request_id"] == r.headers["x-request-id"])
    assert record["reasoning_tokens"] == thinking  # in the audit record, hashed into the chain
    assert (await gw.client.get("/audit/verify", headers=ADMIN)).json()["ok"] is True


async def test_a_stream_carries_the_same_thinking_and_answer(gw: Gateway) -> None:
    params = await _params(gw, "analysis", response_format=FORMAT)
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
    assert "<|" not in thought + answer  # no marker leaks into either
    usage = next(e["usage"] for e in events if e.get("usage"))
    assert usage == full["usage"]


async def test_speculation_keeps_the_thinking_and_the_answer(gw: Gateway) -> None:
    params = await _params(gw, "analysis", response_format=FORMAT)
    std = await gw.chat(**params, decoding={"mode": "standard"})
    spec = await gw.chat(**params, decoding={"mode": "speculative", "proposer": "draft"})
    assert std.status_code == spec.status_code == 200, spec.text
    assert spec.headers["x-decoding-mode"] == "speculative"
    assert std.json()["choices"][0]["message"] == spec.json()["choices"][0]["message"]


async def test_a_final_answer_without_analysis_has_no_reasoning(gw: Gateway) -> None:
    r = await gw.chat(**await _params(gw, "final", response_format=FORMAT))
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message.get("reasoning_content") is None
    jsonschema.validate(json.loads(message["content"]), PERSON)
    assert r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


async def test_an_assistant_message_sent_back_with_its_thinking_is_rendered(gw: Gateway) -> None:
    first = (await gw.chat(**await _params(gw, "analysis", response_format=FORMAT))).json()
    message = first["choices"][0]["message"]
    messages = [
        {"role": "user", "content": "age?"},
        {k: message[k] for k in ("role", "content", "reasoning_content")},
        {"role": "user", "content": "and now?"},
    ]
    r = await gw.client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 4},
        headers=gw.auth,
    )
    assert r.status_code == 200, r.text
    tok = AutoTokenizer.from_pretrained(gw.root / "tiny-target-v1")  # type: ignore[attr-defined]
    prompt = tok.decode(await _tokens(gw, messages=messages))
    assert f"<|channel|>final<|message|>{message['content']}<|end|>" in prompt


async def test_a_calls_thinking_sent_back_is_rendered_as_its_analysis(gw: Gateway) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 2}'}}  # fmt: skip
    messages = [
        {"role": "user", "content": "add 2"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call],
            "reasoning_content": "Need add.",
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    tok = AutoTokenizer.from_pretrained(gw.root / "tiny-target-v1")  # type: ignore[attr-defined]
    prompt = tok.decode(await _tokens(gw, messages=messages))
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>Need add.<|end|>"
        '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 2}<|call|>'
        '<|start|>functions.add to=assistant<|channel|>commentary<|message|>"5"<|end|>'
    ) in prompt
