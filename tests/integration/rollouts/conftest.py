"""Helpers for rollout tests: a gateway on a fresh SQLite file, admin calls, draft copies."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from tests.integration.service.harness import ADMIN, MODEL, Gateway, running_gateway

TARGET, DRAFT = MODEL, "tiny-draft"
SPEC = {"mode": "speculative", "proposer": "draft"}
PROMPTS = ["def add(a, b):", "for i in range(10):", "class Point:", "import json", "print(x)"]


@pytest_asyncio.fixture
async def gw(tiny_manifest: Path, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(tiny_manifest, sqlite_url(tmp_path), tmp_path) as g:
        yield g


def sqlite_url(var: Path) -> str:
    return f"sqlite+aiosqlite:///{var}/gateway.db"


def copy_draft(tiny_manifest: Path, dest: Path, version: str = "1") -> Path:
    """A new version directory holding a byte copy of tiny-draft ``version``."""
    return Path(shutil.copytree(tiny_manifest.parent / f"{DRAFT}-v{version}", dest))


def swap_token_ids(model_dir: Path, a: int, b: int) -> tuple[str, str]:
    """Swap two ids in the tokenizer's vocab (tokenizer still loads, ids no longer agree)."""
    path = model_dir / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    by_id = {i: s for s, i in vocab.items()}
    vocab[by_id[a]], vocab[by_id[b]] = b, a
    path.write_text(json.dumps(tok))
    return by_id[a], by_id[b]


async def admin(gw: Gateway, method: str, url: str, body: Any = None) -> Any:
    if method == "GET":
        return await gw.client.get(url, headers=ADMIN)
    return await gw.client.post(url, json=body, headers=ADMIN)


async def start(gw: Gateway, version: str, percent: float, **extra: Any) -> dict[str, Any]:
    body = {"target": TARGET, "draft": DRAFT, "version": version, "canary_percent": percent}
    r = await admin(gw, "POST", "/admin/rollouts", {**body, **extra})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def speculative(gw: Gateway, prompt: str, max_tokens: int = 16) -> Any:
    r = await gw.complete(prompt, max_tokens=max_tokens, temperature=0, decoding=SPEC)
    assert r.status_code == 200, r.text
    return r


async def events(gw: Gateway, action_prefix: str = "") -> list[dict[str, Any]]:
    r = await admin(gw, "GET", "/audit/events?limit=1000")
    assert r.status_code == 200, r.text
    return [e for e in r.json()["data"] if e["action"].startswith(action_prefix)]


async def wait_for_event(gw: Gateway, action: str, actor: str) -> dict[str, Any]:
    """Poll until an admin event appears (the guard writes its rollback in the background)."""
    for _ in range(100):
        found = [e for e in await events(gw, action) if e["actor"] == actor]
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {action} event by {actor}")
