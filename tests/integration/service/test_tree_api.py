"""speculation.tree through the real HTTP server: a tenant whose policy gives it draft
trees is served with them (the batch verifies trees), and its text equals standard
decoding's; a tenant without keeps chains."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.engine import tree_step
from tests.integration.service.harness import sqlite_gateway
from tests.integration.service.test_suffix_api import complete, tenant_with_policy
from tests.support.spies import count_calls

pytestmark = pytest.mark.asyncio

TREE_POLICY = {"mode": "speculative", "speculation": {"proposers": ["draft"], "tree": [3, 2]}}
CHAIN_POLICY = {"mode": "speculative", "speculation": {"proposers": ["draft"]}}


async def test_a_tenants_policy_turns_draft_trees_on(
    tiny_manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trees = count_calls(monkeypatch, tree_step, "verify_tree_greedy")
    async with sqlite_gateway(tiny_manifest, tmp_path) as gw:
        a = await tenant_with_policy(gw, gw.tenant, TREE_POLICY)
        b = await tenant_with_policy(gw, "tenant-b", CHAIN_POLICY)
        chained = await complete(gw, b, decoding={"mode": "speculative", "k": 4})
        assert chained["mode"] == "speculative" and trees[0] == 0
        tree = await complete(gw, a, decoding={"mode": "speculative", "k": 4})
        assert tree["mode"] == "speculative" and trees[0] > 0
        standard = await complete(gw, b, decoding={"mode": "standard"})
        texts = {x["choices"][0]["text"] for x in (standard, chained, tree)}
        assert len(texts) == 1
