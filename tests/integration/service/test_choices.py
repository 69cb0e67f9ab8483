"""n > 1: n choices, each its own decode row, in full responses and streams; usage and the
audit record count every choice; seeded choices differ from each other and repeat; greedy
ones agree; n beyond MAX_CHOICES is a 400 naming n."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.limits import MAX_CHOICES
from tests.integration.service.harness import Gateway, sqlite_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    async with sqlite_gateway(tiny_manifest, tmp_path_factory.mktemp("var")) as g:
        yield g


def _texts(r: Any) -> list[str]:
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == list(range(len(choices)))
    return [c["message"]["content"] for c in choices]


async def test_seeded_choices_differ_and_repeat(gw: Gateway) -> None:
    params = {"n": 3, "max_tokens": 12, "temperature": 1.0, "seed": 7}
    first = _texts(await gw.chat(**params))
    assert len(first) == 3 and len(set(first)) > 1
    assert _texts(await gw.chat(**params)) == first
    # choice 0 is what n = 1 with the same seed gives
    assert _texts(await gw.chat(**{**params, "n": 1})) == first[:1]


async def test_greedy_choices_agree_and_usage_counts_them_all(gw: Gateway) -> None:
    r = await gw.chat(n=4, max_tokens=8, temperature=0)
    texts = _texts(r)
    assert len(set(texts)) == 1
    assert r.json()["usage"]["completion_tokens"] == 32
    record = (await gw.records())[0]
    assert record["completion_tokens"] == 32


async def test_streamed_choices_rebuild_the_full_ones(gw: Gateway) -> None:
    params = {"n": 2, "max_tokens": 10, "temperature": 1.0, "seed": 3}
    whole = await gw.chat(**params)
    full = _texts(whole)
    full_reasons = [c["finish_reason"] for c in whole.json()["choices"]]
    r = await gw.chat(stream=True, stream_options={"include_usage": True}, **params)
    texts, reasons, usage = ["", ""], [None, None], None
    for line in r.text.split("\n"):
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[6:])
        usage = chunk.get("usage") or usage
        for c in chunk["choices"]:
            texts[c["index"]] += c["delta"].get("content") or ""
            reasons[c["index"]] = c["finish_reason"] or reasons[c["index"]]
    assert texts == full and reasons == full_reasons
    assert usage is not None
    assert usage["completion_tokens"] == whole.json()["usage"]["completion_tokens"]


async def test_n_beyond_the_maximum_is_a_400(gw: Gateway) -> None:
    r = await gw.chat(n=MAX_CHOICES + 1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
