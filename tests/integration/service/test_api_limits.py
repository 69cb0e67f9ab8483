"""The protective limits and value ranges of the OpenAI bodies, as the decoder enforces them
(gateway/http/schemas.py, numbers from gateway/limits.py): each bad value is a 400 in
OpenAI's error shape naming the parameter, and the largest good value is served."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.limits import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    MAX_MESSAGES,
    MAX_PREDICTION_CHARS,
    MAX_STOP,
    MAX_TEXT_CHARS,
)
from tests.integration.service.harness import ADMIN, MODEL, Gateway, sqlite_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
USER = [{"role": "user", "content": "x"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    async with sqlite_gateway(tiny_manifest, tmp_path_factory.mktemp("var")) as g:
        yield g


def _param(r: Any, status: int = 400) -> str | None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err["param"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"seed": 2**70}, "seed"),  # was a 500: no generator or BigInteger column holds it
        ({"seed": INT64_MIN - 1}, "seed"),
        ({"top_k": INT32_MAX + 1}, "top_k"),  # a 32-bit audit column
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ""}, "stop"),
        ({"stop": ["a"] * (MAX_STOP + 1)}, "stop"),
        ({"stop": ["a", ""]}, "stop[1]"),
        ({"logit_bias": {"five": 1}}, "logit_bias"),
        ({"logit_bias": {" 5": 1}}, "logit_bias"),  # int() would take it; the schema does not
        ({"logit_bias": {"5": -101}}, "logit_bias"),
        ({"decoding": {"k": 0}}, "decoding.k"),
        ({"prediction": {"content": "x" * (MAX_PREDICTION_CHARS + 1)}}, "prediction.content"),
        ({"n": 9}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
    ],
)
async def test_out_of_range_values_are_400s_naming_the_parameter(
    gw: Gateway, params: dict[str, Any], param: str
) -> None:
    params = {"max_tokens": 1, **params}
    assert _param(await gw.complete(**params)) == param
    assert _param(await gw.chat(**params)) == param


async def test_chat_message_count_and_text_length(gw: Gateway) -> None:
    body = {"model": MODEL, "messages": USER * (MAX_MESSAGES + 1), "max_tokens": 1}
    r = await gw.client.post("/v1/chat/completions", json=body, headers=gw.auth)
    assert _param(r) == "messages"
    body = {"model": MODEL, "messages": [], "max_tokens": 1}
    r = await gw.client.post("/v1/chat/completions", json=body, headers=gw.auth)
    assert _param(r) == "messages"
    r = await gw.complete("x" * (MAX_TEXT_CHARS + 1), max_tokens=1)
    assert _param(r) == "prompt"
    body = {"model": MODEL, "messages": [{"content": "x"}]}
    r = await gw.client.post("/v1/chat/completions", json=body, headers=gw.auth)
    assert _param(r) == "messages[0].role"


async def test_a_number_beyond_a_double_names_its_parameter(gw: Gateway) -> None:
    body = b'{"model": "%s", "prompt": "x", "temperature": 1e400}' % MODEL.encode()
    headers = {**gw.auth, "content-type": "application/json"}
    r = await gw.client.post("/v1/completions", content=body, headers=headers)
    assert _param(r) == "temperature"


async def test_completion_top_logprobs_bound(gw: Gateway) -> None:
    r = await gw.chat(max_tokens=1, logprobs=True, top_logprobs=21)
    assert _param(r) == "top_logprobs"
    assert _param(await gw.complete(max_tokens=1, logprobs=21)) == "logprobs"


@pytest.mark.parametrize("seed", [INT64_MIN, -1, 0, INT64_MAX])
async def test_every_int64_seed_is_served(gw: Gateway, seed: int) -> None:
    r = await gw.complete(max_tokens=2, temperature=1.0, seed=seed)
    assert r.status_code == 200, r.text
    rec = [x for x in await gw.records() if x["request_id"] == r.headers["x-request-id"]]
    assert rec[0]["seed"] == seed


@pytest.mark.parametrize("record_id", ["25058212270123387977728", str(INT64_MAX + 1), "0", "-3"])
async def test_record_ids_outside_int64_are_400s(gw: Gateway, record_id: str) -> None:
    # 25058212270123387977728 was a 500: the id reached the database
    r = await gw.client.get(f"/audit/records/{record_id}", headers=ADMIN)
    assert _param(r) == "record_id"
    r = await gw.client.get(f"/audit/records/{INT64_MAX}", headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("url", ["/audit/records", "/audit/events"])
async def test_malformed_cursors_are_400s(gw: Gateway, url: str) -> None:
    # /audit/events?cursor=0 was a 500 (the fuzzer's first find): only /audit/records
    # turned the store's ValueError into a 400
    beyond = base64.urlsafe_b64encode(b'{"after":%d,"order":"desc"}' % 2**70).decode()
    for cursor in ["0", "not-base64!", beyond]:
        r = await gw.client.get(url, params={"cursor": cursor}, headers=ADMIN)
        assert _param(r) == "cursor", (url, cursor)


@pytest.mark.parametrize("tenant_id", ["ends-in-newline\n", "UPPER", "x" * 64, "-dash"])
async def test_tenant_ids_follow_the_documented_pattern(gw: Gateway, tenant_id: str) -> None:
    # the pattern is published in the document; re.match's $ accepted a final newline
    body = {"id": tenant_id, "name": "T"}
    assert _param(await gw.client.post("/admin/tenants", json=body, headers=ADMIN)) == "id"


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"status": "78119810142412566065481296904192"}, "status"),  # was a 500 (fuzzer)
        ({"status": "99"}, "status"),
        ({"status": "²"}, "status"),  # str.isdigit() takes it, int() does not
        ({"limit": "²"}, "limit"),
    ],
)
async def test_integer_query_values_are_checked_before_the_query(
    gw: Gateway, params: dict[str, str], param: str
) -> None:
    for url in ("/audit/records", "/audit/export", "/audit/summary"):
        if "limit" in params and url != "/audit/records":
            continue
        assert _param(await gw.client.get(url, params=params, headers=ADMIN)) == param, url
