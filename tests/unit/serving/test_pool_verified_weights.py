"""The model pool keeps the weights it verified (serving/models.py `verified`): a second
start on the same var dir loads every model without hashing its weights again, and a
changed weight file is hashed again and refused. The control: a pool without the cache
hashes at every start."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import models_registry.manifest as manifest_module
from gateway.serving.errors import GatewayError
from gateway.serving.models import ModelPool, PoolOptions
from models_registry.errors import IntegrityError
from models_registry.manifest import load_manifest
from tests.integration import tiny_models


async def inline(fn: Callable[[], object]) -> object:
    """A pool runner that runs its function here (no inference thread)."""
    return fn()


async def _start(manifest_path: Path, verified: Path | None) -> ModelPool:
    pool = ModelPool(load_manifest(manifest_path), inline, PoolOptions(device="cpu"))
    pool.verified = verified
    await pool.load_targets()
    return pool


@pytest.mark.parametrize("cached", [True, False], ids=["cache", "control-no-cache"])
async def test_a_restart_does_not_hash_unchanged_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    hashed: list[tuple[Path, ...]] = []
    real = manifest_module.sha256_files

    def counting(files: tuple[Path, ...]) -> str:
        hashed.append(files)
        return real(files)

    monkeypatch.setattr(manifest_module, "sha256_files", counting)
    path = tiny_models.build(tmp_path / "models")
    verified = tmp_path / "var" / "verified-weights.json" if cached else None
    await _start(path, verified)
    first = len(hashed)
    assert first >= 1
    await _start(path, verified)
    assert (len(hashed) == first) is cached, hashed


async def test_a_changed_weight_file_is_hashed_again_and_refused(tmp_path: Path) -> None:
    path = tiny_models.build(tmp_path / "models")
    verified = tmp_path / "var" / "verified-weights.json"
    pool = await _start(path, verified)
    target = pool.manifest.targets()[0]
    weights = next(target.path.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit, size unchanged
    weights.write_bytes(bytes(data))
    with pytest.raises((IntegrityError, GatewayError)):
        await _start(path, verified)
