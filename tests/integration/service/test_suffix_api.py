"""Proposer "suffix" through the real HTTP server: a tenant whose policy lists it is served
with it (decision, audit record); its repeated request drafts from its own earlier answer
(more accepted tokens, the same text); another tenant sending the same prompt drafts only
from its own text (exactly as many accepted tokens as the first tenant's first request);
the text always equals standard decoding's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.service.harness import ADMIN, MODEL, Gateway, sqlite_gateway

pytestmark = pytest.mark.asyncio

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"
K = {"k": 4}
SUFFIX_POLICY = {"mode": "speculative", "speculation": {"proposers": ["suffix"]}}


async def complete(gw: Gateway, headers: dict[str, str], **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 32, "temperature": 0, **extra}
    r = await gw.client.post("/v1/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    out["mode"] = r.headers["x-decoding-mode"]
    return out


def accepted(body: dict[str, Any]) -> int:
    return int(body["usage"]["completion_tokens_details"]["accepted_prediction_tokens"])


async def tenant_with_policy(gw: Gateway, tenant: str, policy: dict[str, Any]) -> dict[str, str]:
    if tenant != gw.tenant:
        r = await gw.client.post(
            "/admin/tenants", json={"id": tenant, "name": tenant}, headers=ADMIN
        )
        assert r.status_code == 201, r.text
    r = await gw.client.put(f"/admin/policies/tenants/{tenant}", json=policy, headers=ADMIN)
    assert r.status_code == 200, r.text
    if tenant == gw.tenant:
        return gw.auth
    r = await gw.client.post(
        f"/admin/tenants/{tenant}/keys", json={"role": "tenant"}, headers=ADMIN
    )
    return {"authorization": f"Bearer {r.json()['key']}"}


async def test_a_tenants_policy_picks_suffix_and_its_own_history_serves_it(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path) as gw:
        a = await tenant_with_policy(gw, gw.tenant, SUFFIX_POLICY)
        b = await tenant_with_policy(gw, "tenant-b", SUFFIX_POLICY)
        # k fixed: a proposal then depends only on the context and the index
        first = await complete(gw, a, decoding=K)  # nothing in its index yet: its own text
        second = await complete(gw, a, decoding=K)
        other = await complete(gw, b, decoding=K)
        standard = await complete(gw, b, decoding={"mode": "standard"})
        assert standard["mode"] == "standard"
        texts = {x["choices"][0]["text"] for x in (standard, first, second, other)}
        assert len(texts) == 1  # every proposal was verified: the output never changes
        assert first["mode"] == second["mode"] == other["mode"] == "speculative"
        # the repeat drafts the tenant's earlier answer, and the target keeps it
        tokens = second["usage"]["completion_tokens"]
        assert accepted(second) > accepted(first)
        assert accepted(second) >= tokens // 2
        # the other tenant never sees the first one's text: it drafts from its own only
        assert accepted(other) == accepted(first)
        records = [r for r in await gw.records() if r["mode"] == "speculative"]
        assert records and {r["proposer"] for r in records} == {"suffix"}
        store = gw.services.generation.suffix
        assert store.source(gw.tenant, MODEL).index().tokens > 0
        assert store.source(gw.tenant, MODEL).index().sequences == 2
        assert store.source("tenant-b", MODEL).index().sequences == 2  # its own requests only


async def test_a_tenant_without_suffix_in_its_policy_keeps_no_texts(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    async with sqlite_gateway(tiny_manifest, tmp_path) as gw:
        await complete(gw, gw.auth)
        store = gw.services.generation.suffix
        assert store.source(gw.tenant, MODEL).index().tokens == 0
