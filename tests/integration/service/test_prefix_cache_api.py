"""Kept prompt prefixes through the API: a tenant's repeated prompt is reported as cached
(``usage.prompt_tokens_details.cached_tokens``, ``gateway_prompt_cached_tokens_total``)
and decodes the same text; another tenant's identical prompt, or a gateway with
GATEWAY_PREFIX_CACHE off, prefills everything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.service.harness import ADMIN, MODEL, Gateway, sqlite_gateway

pytestmark = pytest.mark.asyncio

PROMPT = "def add(a, b):\n    return a + b\n" * 3  # well past the 16 tokens a reuse needs


async def complete(gw: Gateway, headers: dict[str, str] | None = None, n: int = 1) -> dict:  # type: ignore[type-arg]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "n": n}
    r = await gw.client.post("/v1/completions", json=body, headers=headers or gw.auth)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def other_tenant_key(gw: Gateway) -> dict[str, str]:
    r = await gw.client.post("/admin/tenants", json={"id": "tenant-b", "name": "b"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    r = await gw.client.post("/admin/tenants/tenant-b/keys", json={"role": "tenant"}, headers=ADMIN)
    return {"authorization": f"Bearer {r.json()['key']}"}


def cached(body: dict) -> int:  # type: ignore[type-arg]
    return int(body["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_a_tenants_repeated_prompt_is_cached_for_it_alone(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path) as gw:
        first = await complete(gw)
        second = await complete(gw)
        other = await complete(gw, await other_tenant_key(gw))
        prompt_tokens = first["usage"]["prompt_tokens"]
        assert prompt_tokens > 17
        assert cached(first) == 0
        assert cached(second) == prompt_tokens - 1  # all but the token its first step feeds
        assert cached(other) == 0  # same prompt, another tenant: prefilled
        texts = {b["choices"][0]["text"] for b in (first, second, other)}
        assert len(texts) == 1
        # the other tenant's request took the slot: this tenant's prefix had moved aside
        two = await complete(gw, n=2)
        assert cached(two) == prompt_tokens - 1  # the prompt counts once, as in prompt_tokens
        assert {c["text"] for c in two["choices"]} == texts
        metrics = (await gw.client.get("/metrics")).text
        line = next(
            x for x in metrics.splitlines()
            if x.startswith("gateway_prompt_cached_tokens_total") and gw.tenant in x
        )  # fmt: skip
        assert float(line.rsplit(" ", 1)[1]) == 2 * (prompt_tokens - 1)


async def test_off_prefills_every_prompt(tiny_manifest: Path, tmp_path: Path) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path, prefix_cache=False) as gw:
        await complete(gw)
        assert cached(await complete(gw)) == 0
