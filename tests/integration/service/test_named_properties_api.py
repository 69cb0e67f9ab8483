"""Schemas as frameworks send them, over HTTP: a response_format object schema without
additionalProperties generates only its named properties; `decoding.open_objects` gives the
letter of JSON Schema back. A model pushed (logit_bias) towards a comma after every value
shows the difference: closed, the grammar leaves it no comma and the document ends;
opened, it writes keys the schema never named."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.integration.service.harness import MODEL, Gateway, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

PERSON = {  # as pydantic writes `class Person(BaseModel): age: int`
    "properties": {"age": {"title": "Age", "type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["age"],
    "title": "Person",
    "type": "object",
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "Person", "schema": PERSON}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    var = tmp_path_factory.mktemp("var")
    async with running_gateway(tiny_manifest, f"sqlite+aiosqlite:///{var}/g.db", var) as g:
        yield g


async def _comma(gw: Gateway) -> int:
    r = await gw.client.post("/tokenize", json={"model": MODEL, "prompt": ","}, headers=gw.auth)
    assert r.status_code == 200, r.text
    (token,) = r.json()["tokens"]
    return int(token)


async def test_only_the_named_properties_are_generated_unless_objects_are_opened(
    gw: Gateway,
) -> None:
    bias = {str(await _comma(gw)): 100}
    params = {"max_tokens": 40, "temperature": 0, "logit_bias": bias, "response_format": FORMAT}
    closed = await gw.chat(**params, decoding={"mode": "standard"})
    assert closed.status_code == 200, closed.text
    choice = closed.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert set(json.loads(choice["message"]["content"])) == {"age"}

    opened = await gw.chat(**params, decoding={"mode": "standard", "open_objects": True})
    assert opened.status_code == 200, opened.text
    text = opened.json()["choices"][0]["message"]["content"]
    assert text.startswith('{"age":') and "," in text  # a key the schema never named


async def test_speculation_keeps_the_closed_output(gw: Gateway) -> None:
    bias = {str(await _comma(gw)): 100}
    params = {"max_tokens": 40, "temperature": 0, "logit_bias": bias, "response_format": FORMAT}
    std = await gw.chat(**params, decoding={"mode": "standard"})
    spec = await gw.chat(**params, decoding={"mode": "speculative", "proposer": "draft"})
    assert std.status_code == spec.status_code == 200, spec.text
    assert std.json()["choices"][0]["message"] == spec.json()["choices"][0]["message"]
