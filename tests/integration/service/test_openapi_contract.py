"""The OpenAPI document describes every request body and audit query parameter, and the
bodies decoded at the HTTP edge keep their OpenAI-shaped 400s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.integration.service.harness import ADMIN, MODEL, Gateway, sqlite_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

DRAFT = "tiny-draft"
ROLLOUT = {"target": MODEL, "draft": DRAFT, "version": "2", "canary_percent": 10}
MODEL_BODY = {"name": DRAFT, "version": "7", "role": "draft", "target": MODEL, "path": "/x"}
# operation -> (component schema of its body, the fields it requires)
BODIES = {
    ("post", "/v1/chat/completions"): ("ChatCompletionRequest", {"model", "messages"}),
    ("post", "/v1/completions"): ("CompletionRequest", {"model", "prompt"}),
    ("post", "/tokenize"): ("TokenizeRequest", {"model"}),
    ("post", "/admin/tenants"): ("TenantCreate", {"id", "name"}),
    ("post", "/admin/tenants/{tenant_id}/keys"): ("KeyCreate", set()),
    ("post", "/admin/policies/resolve"): ("PolicyResolve", {"tenant"}),
    ("post", "/admin/models"): ("ModelRegister", {"name", "version", "role", "path"}),
    ("post", "/admin/rollouts"): (
        "RolloutStart",
        {"target", "draft", "version", "canary_percent"},
    ),
    ("put", "/admin/policies/tenants/{tenant_id}"): (None, set()),  # a free-form object
    ("post", "/admin/operators"): ("OperatorCreate", {"name", "role"}),
    ("post", "/admin/operators/{name}/keys"): ("OperatorKeyCreate", set()),
    ("post", "/admin/keys/{key_id}/rotate"): ("KeyRotate", set()),
}
BODYLESS = {("post", "/admin/policies/reload"), ("post", "/admin/rollouts/{rollout_id}/{action}")}
FILTERS = {
    "tenant",
    "since",
    "until",
    "mode",
    "target_model",
    "target_version",
    "draft_model",
    "draft_version",
    "status",
    "decision_id",
    "user",
    "trace_id",
}
QUERY = {
    "/audit/records": FILTERS | {"cursor", "limit"},
    "/audit/export": FILTERS | {"format"},
    "/audit/summary": FILTERS,
    "/audit/events": {"since", "until", "cursor", "limit"},
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    async with sqlite_gateway(tiny_manifest, tmp_path_factory.mktemp("var")) as g:
        yield g


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def openapi(gw: Gateway) -> dict[str, Any]:
    r = await gw.client.get("/schema/openapi.json")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _error(r: Any, status: int = 400) -> tuple[str, str | None]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err["message"], err["param"]


async def _post(gw: Gateway, url: str, body: Any = None, raw: bytes | None = None) -> Any:
    if raw is not None:
        headers = {**ADMIN, "content-type": "application/json"}
        return await gw.client.post(url, content=raw, headers=headers)
    return await gw.client.post(url, json=body, headers=ADMIN)


async def test_every_body_operation_documents_its_body(openapi: dict[str, Any]) -> None:
    components = openapi["components"]["schemas"]
    seen = set()
    for path, item in openapi["paths"].items():
        for method, op in item.items():
            if method not in ("post", "put", "patch"):
                continue
            seen.add((method, path))
            if (method, path) in BODYLESS:
                assert "requestBody" not in op, (method, path)
                continue
            assert (method, path) in BODIES, f"{method} {path}: a body operation not listed here"
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            name, required = BODIES[method, path]
            if name is None:
                assert schema["type"] == "object" and schema["description"], schema
                continue
            assert schema == {"$ref": f"#/components/schemas/{name}"}, (path, schema)
            component = components[name]
            assert component["type"] == "object" and component["properties"], name
            assert set(component.get("required", [])) == required, name
    assert seen == set(BODIES) | BODYLESS


async def test_admin_body_fields_are_described(openapi: dict[str, Any]) -> None:
    schemas = openapi["components"]["schemas"]
    rollout = schemas["RolloutStart"]["properties"]
    assert set(rollout) == {*ROLLOUT, "baseline_version", "sticky", "guard"}
    assert {"type": "integer"} in rollout["version"]["anyOf"]  # a version may be an integer
    assert all(p.get("description") for k, p in rollout.items() if k != "guard")
    assert set(schemas["GuardSpec"]["properties"]) == {
        "min_samples",
        "max_acceptance_drop",
        "max_latency_regression",
        "window",
    }
    assert set(schemas["ModelRegister"]["properties"]) == set(MODEL_BODY)


async def test_audit_endpoints_list_their_query_parameters(openapi: dict[str, Any]) -> None:
    for path, names in QUERY.items():
        params = {p["name"]: p for p in openapi["paths"][path]["get"]["parameters"]}
        assert {n for n, p in params.items() if p["in"] == "query"} == names, path
        for name in names:
            p = params[name]
            assert p["description"] and not p["required"], (path, p)
            assert p["schema"]["type"] in ("string", "integer"), (path, p)
        if "limit" in names:
            limit = params["limit"]["schema"]
            assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, 1000)
        assert params["since"]["schema"]["format"] == "date-time"
    export = {p["name"]: p for p in openapi["paths"]["/audit/export"]["get"]["parameters"]}
    assert export["format"]["schema"]["enum"] == ["jsonl", "csv"]


async def test_unknown_fields_name_the_field_and_the_allowed_ones(gw: Gateway) -> None:
    r = await _post(gw, "/admin/rollouts", {**ROLLOUT, "colour": "red"})
    allowed = "baseline_version, canary_percent, draft, guard, sticky, target, version"
    assert _error(r) == (f"unknown field 'colour' (allowed: {allowed})", "colour")
    r = await _post(gw, "/admin/models", {**MODEL_BODY, "size": 1})
    assert _error(r) == (
        "unknown field 'size' (allowed: name, path, role, target, version)",
        "size",
    )
    r = await _post(gw, "/admin/rollouts", {**ROLLOUT, "guard": {"nope": 1}})
    guard = "max_acceptance_drop, max_latency_regression, min_samples, window"
    assert _error(r) == (f"unknown field 'nope' (allowed: {guard})", "guard.nope")
    r = await _post(gw, "/admin/tenants", {"id": "t-x", "name": "X", "plan": "gold"})
    assert _error(r) == ("unknown field 'plan' (allowed: id, name)", "plan")


async def test_wrong_types_and_missing_fields_name_the_parameter(gw: Gateway) -> None:
    r = await _post(gw, "/admin/rollouts", {**ROLLOUT, "sticky": "yes"})
    assert _error(r) == ("Expected `bool`, got `str` - at `$.sticky`", "sticky")
    r = await _post(gw, "/admin/rollouts", {**ROLLOUT, "version": True})
    assert _error(r) == ("Expected `int | str`, got `bool` - at `$.version`", "version")
    r = await _post(gw, "/admin/rollouts", {**ROLLOUT, "guard": {"min_samples": "many"}})
    assert _error(r) == (
        "Expected `int`, got `str` - at `$.guard.min_samples`",
        "guard.min_samples",
    )
    r = await _post(gw, "/admin/models", {k: v for k, v in MODEL_BODY.items() if k != "path"})
    assert _error(r) == ("Object missing required field `path`", "path")
    r = await _post(gw, "/admin/policies/resolve", {"request": {}})
    assert _error(r) == ("Object missing required field `tenant`", "tenant")
    r = await _post(gw, "/admin/tenants", {"id": "t", "name": 5})
    assert _error(r) == ("Expected `str`, got `int` - at `$.name`", "name")


async def test_serving_still_checks_the_values(gw: Gateway) -> None:
    # The edge passes on what the client sent (an integer version too); serving's messages hold.
    r = await _post(gw, "/admin/rollouts", {**ROLLOUT, "version": ""})
    assert _error(r) == ("'version' must be a non-empty string", "version")
    r = await _post(gw, "/admin/rollouts", {**ROLLOUT, "version": 9})
    assert "tiny-draft@9" in _error(r, 404)[0]
    r = await _post(gw, "/admin/rollouts", {**ROLLOUT, "canary_percent": 150})
    assert "canary_percent must be a number from 0 to 100, got 150" in _error(r)[0]
    r = await _post(gw, "/admin/models", {**MODEL_BODY, "version": 7, "path": "/nowhere"})
    assert "/nowhere" in _error(r)[0]
    r = await _post(gw, "/admin/models", {**MODEL_BODY, "role": "critic"})
    assert _error(r) == ("role must be 'target' or 'draft', got 'critic'", "role")
    r = await gw.client.put(
        f"/admin/policies/tenants/{gw.tenant}", json={"colour": "red"}, headers=ADMIN
    )
    message, param = _error(r)
    assert message.startswith("invalid policy document") and param == "document"
    r = await _post(gw, "/admin/policies/resolve", {"tenant": gw.tenant, "request": {"seed": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["decision"]["mode"] == "standard"  # the default bundle: a seed forces it
    assert r.json()["decision"]["requested_mode"] is None
    features = {"decoding": {"mode": "speculative"}, "max_tokens": 64}
    r = await _post(gw, "/admin/policies/resolve", {"tenant": gw.tenant, "request": features})
    assert r.status_code == 200, r.text
    assert r.json()["decision"]["requested_mode"] == "speculative"


@pytest.mark.parametrize("url", ["/admin/rollouts", "/admin/models", "/admin/policies/resolve"])
async def test_malformed_empty_and_non_object_bodies(gw: Gateway, url: str) -> None:
    message, param = _error(await _post(gw, url, raw=b"{not json"))
    assert message.startswith("the request body is not valid JSON: ") and param is None
    r = await _post(gw, url, raw=b"")
    assert _error(r) == ("the request body is empty; send a JSON object", None)
    assert _error(await _post(gw, url, [1])) == ("Expected `object`, got `array`", None)


async def test_the_admin_key_is_checked_before_the_body(gw: Gateway) -> None:
    r = await gw.client.post(
        "/admin/rollouts", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 401, r.text
    r = await gw.client.post("/admin/models", json={"colour": 1}, headers=gw.auth)
    assert r.status_code == 403, r.text


async def test_audit_query_values_are_checked_after_auth(gw: Gateway) -> None:
    cases = [
        ("/audit/records", {"limit": "0"}, "limit must be an integer in [1, 1000]", "limit"),
        ("/audit/events", {"limit": "x"}, "limit must be an integer in [1, 1000]", "limit"),
        ("/audit/records", {"status": "ok"}, "status must be an HTTP status code", "status"),
        ("/audit/export", {"format": "xml"}, "format must be jsonl or csv", "format"),
        (
            "/audit/summary",
            {"since": "2026-01-01T00:00:00"},
            "since must carry a timezone (e.g. 2026-12-01T00:00:00Z)",
            "since",
        ),
        (
            "/audit/events",
            {"until": "soon"},
            "until must be an ISO 8601 timestamp, got 'soon'",
            "until",
        ),
    ]
    for url, params, message, param in cases:
        r = await gw.client.get(url, params=params, headers=ADMIN)
        assert _error(r) == (message, param), (url, params)
        assert (await gw.client.get(url, params=params)).status_code == 401
    await gw.chat(max_tokens=1)
    r = await gw.client.get("/audit/records", params={"status": "200", "limit": "1"}, headers=ADMIN)
    assert r.status_code == 200 and len(r.json()["data"]) == 1, r.text
    assert r.json()["data"][0]["status"] == 200
    r = await gw.client.get("/audit/export", params={"format": "csv"}, headers=ADMIN)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")


async def test_stream_events_match_the_documented_event_schema(
    gw: Gateway, openapi: dict[str, Any]
) -> None:
    # The long fuzz run's find: the stream was documented as one string, but an SSE media
    # type's schema describes each event ({data, event, ...}), so every streamed 200 failed.
    import jsonschema

    for path in ("/v1/chat/completions", "/v1/completions"):
        ok = openapi["paths"][path]["post"]["responses"]["200"]["content"]
        schema = ok["text/event-stream"]["schema"]
        r = await (gw.chat if "chat" in path else gw.complete)(max_tokens=2, stream=True)
        assert r.headers["content-type"].startswith("text/event-stream"), r.text
        events = [
            {"data": block.removeprefix("data: "), "event": "message"}
            for block in r.text.split("\n\n")
            if block.startswith("data: ")
        ]
        assert events and events[-1]["data"] == "[DONE]"
        for event in events:
            jsonschema.validate(event, schema)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(events[0]["data"], schema)  # a bare string is not an event
