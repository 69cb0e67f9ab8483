"""GATEWAY_CPU_LINEAR=auto measures the linear forward once per model shape and machine and
keeps the verdict in the var folder: the next start reads it instead of timing again (a
timing that flipped would change every output's rounding and the precompiled steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.speed import cpu_linear
from tests.integration.service.harness import running_gateway, sqlite_gateway


async def test_the_verdict_is_kept_and_read_back_by_the_next_start(
    tiny_manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_linear, "_verdicts", {})  # a fresh process
    monkeypatch.setattr(cpu_linear, "_verdict_file", None)
    async with sqlite_gateway(tiny_manifest, tmp_path, cpu_linear="auto") as gw:
        assert (await gw.complete(max_tokens=2)).status_code == 200
    kept = json.loads((tmp_path / "linear-verdicts.json").read_text())
    assert kept and all(isinstance(v, bool) for v in kept.values())

    def measure(*_args: object) -> bool:
        raise AssertionError("measured again although a verdict was kept")

    monkeypatch.setattr(cpu_linear, "_verdicts", {})  # the next start
    monkeypatch.setattr(cpu_linear, "_measure", measure)
    second = f"sqlite+aiosqlite:///{tmp_path}/second.db"  # same var folder, a new database
    async with running_gateway(tiny_manifest, second, tmp_path, cpu_linear="auto") as gw:
        assert (await gw.complete(max_tokens=2)).status_code == 200
    assert json.loads((tmp_path / "linear-verdicts.json").read_text()) == kept


async def test_a_pinned_forward_keeps_no_verdict(
    tiny_manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_linear, "_verdict_file", tmp_path / "earlier.json")  # another start's
    async with sqlite_gateway(tiny_manifest, tmp_path, cpu_linear="off") as gw:
        assert (await gw.complete(max_tokens=2)).status_code == 200
        assert cpu_linear._verdict_file is None  # a later load_fast(cpu_linear=None) keeps none
    assert not (tmp_path / "linear-verdicts.json").exists()
