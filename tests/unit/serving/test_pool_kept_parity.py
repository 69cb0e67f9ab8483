"""The lean decoder's parity verdict is kept for the next start (speed/kept_parity.py): a
second start of the same models on the same machine serves the lean decoder without
checking it again; another key (other weights, other code) checks again, and a check that
failed is not kept. The control: a pool without the store checks at every start."""

from __future__ import annotations

from pathlib import Path

import pytest

import gateway.speed.kept_parity as kept_parity
from gateway.engine.models import LoadedModel, load_model
from gateway.serving.models import ModelPool, PoolOptions
from gateway.speed import accelerate
from gateway.speed.fast import lean_of
from gateway.speed.kept_parity import KeptParity
from gateway.speed.lean import LeanDecoder
from models_registry.manifest import load_manifest
from tests.integration import tiny_models
from tests.unit.serving.test_pool_verified_weights import inline


def _count_checks(monkeypatch: pytest.MonkeyPatch, passes: bool = True) -> list[int]:
    calls: list[int] = []
    real = LeanDecoder.checked

    def counting(self: LeanDecoder) -> LeanDecoder | None:
        calls.append(1)
        return real(self) if passes else None

    monkeypatch.setattr(LeanDecoder, "checked", counting)
    return calls


def _target(tmp_path: Path) -> LoadedModel:
    manifest = load_manifest(tiny_models.build(tmp_path / "models"))
    return load_model(manifest.targets()[0].path, "cpu")


async def _start(manifest: Path, store: KeptParity | None) -> ModelPool:
    pool = ModelPool(load_manifest(manifest), inline, PoolOptions(device="cpu"))
    pool.parity = store
    await pool.load_targets()
    return pool


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "control-no-store"])
async def test_a_restart_adopts_the_kept_parity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    calls = _count_checks(monkeypatch)
    manifest = tiny_models.build(tmp_path / "models")
    store = KeptParity(tmp_path / "var" / "lean-parity.json") if kept else None
    first = await _start(manifest, store)
    assert len(calls) == 1
    second = await _start(manifest, store)
    assert len(calls) == (1 if kept else 2)
    target = first.manifest.targets()[0].name
    _, engine = await second.target(target)
    assert lean_of(engine.target) is not None  # served lean either way


def test_another_key_checks_again_and_a_failed_check_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = _target(tmp_path)
    store = KeptParity(tmp_path / "lean-parity.json")
    calls = _count_checks(monkeypatch)
    accelerate(lm, cpu_linear=False, kept=(store, "a" * 64))
    accelerate(lm, cpu_linear=False, kept=(store, "a" * 64))
    assert len(calls) == 1
    accelerate(lm, cpu_linear=False, kept=(store, "b" * 64))  # other weights
    assert len(calls) == 2
    monkeypatch.setattr(kept_parity, "code_digest", lambda: "other code")
    accelerate(lm, cpu_linear=False, kept=(store, "a" * 64))
    assert len(calls) == 3
    accelerate(lm, cpu_linear=True, kept=(store, "a" * 64))  # another linear form
    assert len(calls) == 4
    failing = _count_checks(monkeypatch, passes=False)
    for _ in range(2):
        out = accelerate(lm, cpu_linear=False, kept=(store, "c" * 64))
        assert lean_of(out) is None  # the model's own forward
    assert len(failing) == 2  # a failure is checked again at every start


def test_an_unreadable_store_checks_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lm = _target(tmp_path)
    path = tmp_path / "lean-parity.json"
    path.write_text("{not json")
    calls = _count_checks(monkeypatch)
    accelerate(lm, cpu_linear=False, kept=(KeptParity(path), "a" * 64))
    accelerate(lm, cpu_linear=False, kept=(KeptParity(path), "a" * 64))
    assert len(calls) == 1  # rewritten after the first check
