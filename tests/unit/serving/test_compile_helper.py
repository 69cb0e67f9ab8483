"""GATEWAY_COMPILE_HELPER: at start, a helper process compiles the drafts while the pool
compiles its target, and the pool then loads the drafts' steps the helper saved."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from gateway.serving.models import ModelPool, PoolOptions
from gateway.serving.worker import InferenceWorker, WorkerOptions
from gateway.speed import precompile
from gateway.speed.fast import compiled_of
from gateway.speed.precompile import Helper
from models_registry.manifest import load_manifest
from tests.integration import tiny_models

pytestmark = pytest.mark.compile

KINDS = ["1x1", "1xN", "Bx1", "BxN"]
ONE_ROW = 1
"""The batch rows of a start whose test is about where the steps compile, not which kinds:
one row compiles the two one-row kinds, half a start's compile (tests of the kinds
themselves: tests/unit/speed/test_compiled.py)."""


async def load(tmp_path, helper: bool, rows: int = 4) -> ModelPool:  # type: ignore[no-untyped-def]
    models = tmp_path / "models"
    manifest = load_manifest(
        models / "manifest.yaml" if models.exists() else tiny_models.build(models)
    )
    worker = InferenceWorker(WorkerOptions(capacity=8, max_active=1))
    worker.start()

    async def runner(fn):  # type: ignore[no-untyped-def]
        return await worker.call(fn)

    pool = ModelPool(
        manifest,
        runner,
        PoolOptions(
            device="cpu",
            compile_rows=lambda context: rows,
            cpu_linear=False,
            compile_mode="on",
            compile_store=tmp_path / "store",
            compile_helper=helper,
        ),
    )
    try:
        await pool.load_targets()
    finally:
        worker.stop()
    return pool


async def test_the_drafts_compile_in_a_helper_while_the_target_compiles_here(
    tmp_path, caplog
) -> None:
    with caplog.at_level(logging.INFO):
        pool = await load(tmp_path, helper=True)
    (name,) = pool.target_names()
    _, engine = await pool.target(name)
    assert compiled_of(engine.target).step.loaded == ["BxN"]  # type: ignore[union-attr]  # 3 here
    drafts = pool.loaded_draft_models(name)
    assert len(drafts) == 2
    for draft in drafts.values():  # compiled by the helper: loaded, nothing traced here
        assert sorted(compiled_of(draft).step.loaded) == KINDS  # type: ignore[union-attr]
    assert "compile helper (pid" in caplog.text
    assert "compile helper: " in caplog.text  # its progress, in this process's log

    caplog.clear()  # a restart: every step is stored, so no helper (it would only cost)
    with caplog.at_level(logging.INFO):
        again = await load(tmp_path, helper=True)
    assert "compile helper" not in caplog.text
    models = [again._engines[name][1].target, *again.loaded_draft_models(name).values()]
    assert [sorted(compiled_of(m).step.loaded) for m in models] == [KINDS] * 3  # type: ignore[union-attr]


async def test_without_the_helper_every_model_compiles_here(tmp_path, caplog) -> None:
    with caplog.at_level(logging.INFO):
        pool = await load(tmp_path, helper=False, rows=ONE_ROW)
    drafts = pool.loaded_draft_models(pool.target_names()[0]).values()
    assert [compiled_of(d).step.loaded for d in drafts] == [[], []]  # type: ignore[union-attr]
    assert "compile helper" not in caplog.text


def fake_helper(code: str) -> Helper:
    """A helper process that runs `code` instead of compiling."""
    command = [sys.executable, "-c", code]
    out = subprocess.PIPE
    return Helper(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True))


@pytest.mark.parametrize("broken", ["exits", "cannot start"])
async def test_a_broken_helper_leaves_every_model_to_compile_here(
    tmp_path, caplog, monkeypatch, broken
) -> None:
    def start(jobs, store, models=None):  # type: ignore[no-untyped-def]
        if broken == "cannot start":
            raise OSError("no processes left")
        return fake_helper("print('boom'); raise SystemExit(3)")

    monkeypatch.setattr(precompile, "start", start)
    with caplog.at_level(logging.INFO):
        pool = await load(tmp_path, helper=True, rows=ONE_ROW)
    drafts = pool.loaded_draft_models(pool.target_names()[0]).values()
    assert [compiled_of(d).step.loaded for d in drafts] == [[], []]  # type: ignore[union-attr]
    assert all(compiled_of(d).step.fns for d in drafts)  # type: ignore[union-attr]  # compiled
    if broken == "exits":
        assert "compile helper failed (exit 3)" in caplog.text
        assert "compile helper: boom" in caplog.text
    else:
        assert "no compile helper (OSError: no processes left)" in caplog.text


async def test_a_start_that_fails_stops_its_helper(tmp_path, monkeypatch) -> None:
    helpers: list[Helper] = []

    def start(jobs, store, models=None):  # type: ignore[no-untyped-def]
        helpers.append(fake_helper("import time; time.sleep(120)"))
        return helpers[-1]

    def load_target(self, entry, model):  # type: ignore[no-untyped-def]
        raise RuntimeError("the target does not load")

    monkeypatch.setattr(precompile, "start", start)
    monkeypatch.setattr(ModelPool, "_load_target", load_target)
    with pytest.raises(RuntimeError, match="does not load"):
        await load(tmp_path, helper=True)
    assert len(helpers) == 1 and helpers[0].process.returncode is not None  # killed, reaped
