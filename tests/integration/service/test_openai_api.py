"""The OpenAI-compatible API through Litestar's test client, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.integration.service.harness import ADMIN, MODEL, Gateway, running_gateway
from tests.pg import fresh_database

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["sqlite", "postgres"])
async def gw(
    request: pytest.FixtureRequest, tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    var = tmp_path_factory.mktemp("var")
    if request.param == "sqlite":
        async with running_gateway(tiny_manifest, f"sqlite+aiosqlite:///{var}/g.db", var) as g:
            yield g
    else:
        async with fresh_database("gw") as url, running_gateway(tiny_manifest, url, var) as g:
            yield g


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


async def test_models_lists_the_target(gw: Gateway) -> None:
    r = await gw.client.get("/v1/models", headers=gw.auth)
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == [MODEL]


async def test_chat_greedy_has_headers_usage_and_audit(gw: Gateway) -> None:
    r = await gw.chat(max_tokens=6, temperature=0, decoding={"mode": "standard"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6
    assert r.headers["x-decoding-mode"] == "standard"
    rid, did = r.headers["x-request-id"], r.headers["x-decision-id"]
    rec = [x for x in await gw.records() if x["request_id"] == rid]
    assert len(rec) == 1 and rec[0]["decision_id"] == did and rec[0]["status"] == 200
    assert rec[0]["completion_tokens"] == 6 and rec[0]["mode"] == "standard"


async def test_speculative_greedy_equals_standard_and_reports_acceptance(gw: Gateway) -> None:
    std = await gw.complete(max_tokens=24, temperature=0, decoding={"mode": "standard"})
    spec = await gw.complete(
        max_tokens=24,
        temperature=0,
        decoding={"mode": "speculative", "proposer": "draft", "k": 4},
    )
    assert std.status_code == spec.status_code == 200, spec.text
    assert spec.headers["x-decoding-mode"] == "speculative"
    assert spec.headers["x-draft-model"].startswith("tiny-draft@")
    assert spec.json()["choices"][0]["text"] == std.json()["choices"][0]["text"]
    details = spec.json()["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"] > 0
    rec = next(x for x in await gw.records() if x["request_id"] == spec.headers["x-request-id"])
    assert rec["proposer"] == "draft" and rec["draft_model"] == "tiny-draft"
    assert rec["drafted_tokens"] >= rec["accepted_tokens"] == details["accepted_prediction_tokens"]


async def test_prediction_counts_accepted_and_rejected_tokens(gw: Gateway) -> None:
    std = await gw.complete(max_tokens=16, temperature=0, decoding={"mode": "standard"})
    text = std.json()["choices"][0]["text"]
    r = await gw.complete(
        max_tokens=16,
        temperature=0,
        prediction={"type": "content", "content": text},
        decoding={"mode": "speculative", "proposer": "prediction"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == text
    details = r.json()["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0


async def test_completion_logprobs_legacy_shape(gw: Gateway) -> None:
    r = await gw.complete(max_tokens=5, temperature=0, logprobs=2)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == 5
    assert all(len(top) <= 2 and all(v <= 0 for v in top.values()) for top in lp["top_logprobs"])
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])


async def test_stream_matches_non_stream_and_ends_with_done(gw: Gateway) -> None:
    full = await gw.chat(max_tokens=12, temperature=0)
    r = await gw.chat(
        max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == full.json()["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert r.headers["x-request-id"] in {x["request_id"] for x in await gw.records()}


async def test_seed_makes_sampling_repeatable(gw: Gateway) -> None:
    a = await gw.complete(max_tokens=10, temperature=1.0, seed=7)
    b = await gw.complete(max_tokens=10, temperature=1.0, seed=7)
    assert a.json()["choices"][0]["text"] == b.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
        ({"model": MODEL}, 400, "messages"),
        ({"model": MODEL, "messages": "hello"}, 400, "messages"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": -1},
            400,
            "max_tokens",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
            400,
            "max_tokens",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 9}, 400, "n"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 3},
            400,
            "temperature",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]}, 400, "messages"),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "logit_bias": {"5": 500},
            },
            400,
            "logit_bias",
        ),
        ({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ],
)
async def test_bad_inputs_get_openai_errors_and_are_audited(
    gw: Gateway, body: dict[str, object], status: int, param: str
) -> None:
    r = await gw.client.post("/v1/chat/completions", json=body, headers=gw.auth)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    rec = [x for x in await gw.records() if x["request_id"] == r.headers["x-request-id"]]
    assert len(rec) == 1 and rec[0]["status"] == status and rec[0]["mode"] is None


async def test_invalid_json_body_is_a_400(gw: Gateway) -> None:
    r = await gw.client.post("/v1/chat/completions", content=b"{not json", headers=gw.auth)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


async def test_keys_auth_and_roles(gw: Gateway) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    r = await gw.client.post("/v1/completions", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = await gw.client.post("/v1/completions", json=body, headers={"authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    auditor = {"authorization": f"Bearer {gw.auditor_key}"}
    assert (await gw.client.post("/v1/completions", json=body, headers=auditor)).status_code == 403
    assert (await gw.client.get("/audit/records", headers=gw.auth)).status_code == 403
    r = await gw.client.post(
        f"/admin/tenants/{gw.tenant}/keys", json={"role": "tenant"}, headers=ADMIN
    )
    key_id, key = r.json()["id"], r.json()["key"]
    ok = await gw.client.post(
        "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    assert ok.status_code == 200
    assert (await gw.client.delete(f"/admin/keys/{key_id}", headers=ADMIN)).status_code == 200
    r = await gw.client.post(
        "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    assert r.status_code == 401
    assert (await gw.client.delete(f"/admin/keys/{key_id}", headers=ADMIN)).status_code == 404
    assert (await gw.client.get("/admin/tenants", headers=gw.auth)).status_code == 403


async def test_tenants_conflict_and_isolation(gw: Gateway) -> None:
    r = await gw.client.post(
        "/admin/tenants", json={"id": gw.tenant, "name": "again"}, headers=ADMIN
    )
    assert r.status_code == 409
    other = "tenant-other"
    assert (
        await gw.client.post("/admin/tenants", json={"id": other, "name": "O"}, headers=ADMIN)
    ).status_code == 201
    r = await gw.client.post(
        f"/admin/tenants/{other}/keys", json={"role": "auditor"}, headers=ADMIN
    )
    other_auditor = {"authorization": f"Bearer {r.json()['key']}"}
    r = await gw.client.get("/audit/records", headers=other_auditor)
    assert r.status_code == 200 and all(x["tenant_id"] == other for x in r.json()["data"])
    r = await gw.client.get("/audit/records", params={"tenant": gw.tenant}, headers=other_auditor)
    assert r.status_code == 403
    mine = await gw.client.get(
        "/audit/records", headers={"authorization": f"Bearer {gw.auditor_key}"}
    )
    assert mine.json()["data"] and all(x["tenant_id"] == gw.tenant for x in mine.json()["data"])


async def test_rate_limit_429_with_retry_after(gw: Gateway) -> None:
    tenant = "tenant-limited"
    await gw.client.post("/admin/tenants", json={"id": tenant, "name": "L"}, headers=ADMIN)
    doc = {"rate_limits": {"requests_per_minute": 2}}
    r = await gw.client.put(f"/admin/policies/tenants/{tenant}", json=doc, headers=ADMIN)
    assert r.status_code == 200, r.text
    key = (
        await gw.client.post(
            f"/admin/tenants/{tenant}/keys", json={"role": "tenant"}, headers=ADMIN
        )
    ).json()["key"]
    h = {"authorization": f"Bearer {key}"}
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    codes = [(await gw.client.post("/v1/completions", json=body, headers=h)) for _ in range(3)]
    assert [c.status_code for c in codes] == [200, 200, 429]
    assert codes[0].headers["x-ratelimit-limit-requests"] == "2"
    assert int(codes[2].headers["retry-after"]) >= 1
    assert codes[2].json()["error"]["type"] == "rate_limit_error"


async def test_ops_endpoints(gw: Gateway) -> None:
    assert (await gw.client.get("/health")).json() == {"status": "ok"}
    assert (await gw.client.get("/ready")).status_code == 200
    metrics = (await gw.client.get("/metrics")).text
    assert "spec_decode_num_draft_tokens_total" in metrics
    assert "gateway_queue_depth" in metrics
    schema = (await gw.client.get("/schema/openapi.json")).json()
    assert "/v1/chat/completions" in schema["paths"]


async def test_tokenize(gw: Gateway) -> None:
    r = await gw.client.post(
        "/tokenize", json={"model": MODEL, "prompt": "def add"}, headers=gw.auth
    )
    assert (
        r.status_code == 200 and r.json()["tokens"] and r.json()["count"] == len(r.json()["tokens"])
    )


async def test_chain_verifies_after_traffic(gw: Gateway) -> None:
    r = await gw.client.get("/audit/verify", headers=ADMIN)
    assert r.json()["ok"] is True and r.json()["checked"] > 5


SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}, "n": {"type": "integer"}},
    "required": ["color"],
    "additionalProperties": False,
}


async def test_json_schema_output_validates_and_speculation_keeps_it(gw: Gateway) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA, "strict": True}}
    std = await gw.chat(
        max_tokens=48, temperature=0, response_format=fmt, decoding={"mode": "standard"}
    )
    spec = await gw.chat(
        max_tokens=48,
        temperature=0,
        response_format=fmt,
        decoding={"mode": "speculative", "proposer": "draft"},
    )
    assert std.status_code == spec.status_code == 200, spec.text
    a, b = std.json()["choices"][0], spec.json()["choices"][0]
    assert a["message"]["content"] == b["message"]["content"]
    if a["finish_reason"] == "stop":
        value = json.loads(a["message"]["content"])
        assert value["color"] in ("red", "green") and set(value) <= {"color", "n"}
    else:
        assert a["finish_reason"] == "length"
    rec = next(x for x in await gw.records() if x["request_id"] == spec.headers["x-request-id"])
    assert rec["constraint"] == "json_schema" and rec["constraint_sha256"]


async def test_json_object_mode_returns_an_object(gw: Gateway) -> None:
    r = await gw.chat(max_tokens=48, temperature=0, response_format={"type": "json_object"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "strnig"},
        {"type": "object", "properties": {"a": {"type": "string", "maxLenght": 3}}},
    ],
)
async def test_bad_schema_is_a_400_naming_it(gw: Gateway, schema: dict[str, object]) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}}
    r = await gw.chat(max_tokens=8, response_format=fmt)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format" and r.json()["error"]["message"]
