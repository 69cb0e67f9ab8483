"""Forward costs timed at load are kept for the next start (serving/cost_store.py): a second
start of the same models on the same machine adopts them instead of probing again; a
different key (here: more rows probed) probes again. The control: a pool without the store
probes at every start."""

from __future__ import annotations

from pathlib import Path

import pytest

import gateway.engine.engine as engine_module
from gateway.serving.cost_store import CostStore
from gateway.serving.models import ModelPool, PoolOptions
from models_registry.manifest import load_manifest
from tests.integration import tiny_models
from tests.unit.serving.test_pool_verified_weights import inline


async def _start(manifest: Path, store: CostStore | None, rows: int) -> ModelPool:
    pool = ModelPool(load_manifest(manifest), inline, PoolOptions(device="cpu", probe_rows=rows))
    pool.costs = store
    await pool.load_targets()
    return pool


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "control-no-store"])
async def test_a_restart_adopts_the_kept_costs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    probes: list[int] = []
    real = engine_module.probe

    def counting(lm, max_rows, tokens):  # type: ignore[no-untyped-def]
        probes.append(max_rows)
        return real(lm, max_rows, tokens)

    monkeypatch.setattr(engine_module, "probe", counting)
    manifest = tiny_models.build(tmp_path / "models")
    store = CostStore(tmp_path / "var" / "forward-costs.json") if kept else None
    first = await _start(manifest, store, rows=2)
    assert probes == [2]
    second = await _start(manifest, store, rows=2)
    target = first.manifest.targets()[0].name
    (_, a), (_, b) = await first.target(target), await second.target(target)
    if kept:
        assert probes == [2]  # adopted, not probed
        assert b.costs[id(b.target)].means == a.costs[id(a.target)].means
    else:
        assert probes == [2, 2]
    await _start(manifest, store, rows=4)  # another key: probed
    assert probes[-1] == 4
