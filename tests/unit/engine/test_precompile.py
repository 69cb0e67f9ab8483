"""A helper process compiles models' steps into the store (engine/precompile.py) and this
process loads them: the same fingerprints on both sides, so nothing is traced again."""

from __future__ import annotations

import logging

from torch._dynamo.utils import counters

from gateway.engine import Engine, load_model
from gateway.engine.compiled import compiled_model
from gateway.engine.precompile import Job, start

from .test_batch import mixed_jobs, run_batch

KINDS = ["1x1", "1xN", "Bx1", "BxN"]


def test_what_a_helper_compiled_loads_here_without_tracing(model_dirs, tmp_path) -> None:
    target = load_model(model_dirs["llama"], device="cpu", cpu_linear=False)
    # the draft's linear forward was decided here (weight-major): the helper must load it so
    draft = load_model(model_dirs["draft"], device="cpu", cpu_linear=True)
    eager = run_batch(Engine(target), mixed_jobs(Engine(target), draft))

    # the batch's rows (run_batch's 8): a step is compiled for its slot buffers' shape
    helper = start([Job.of(target, 8, draft=False), Job.of(draft, 8, draft=True)], tmp_path)
    assert helper.wait(600)
    assert len(list(tmp_path.glob("step-*.pt"))) == 8
    traced = counters["stats"]["unique_graphs"]
    fast_target, _ = compiled_model(target, 8, store=tmp_path)
    fast_draft, _ = compiled_model(draft, 8, draft=True, store=tmp_path)
    for fast in (fast_target, fast_draft):
        assert sorted(fast.compiled.step.loaded) == KINDS  # type: ignore[union-attr]
    engine = Engine(fast_target)
    got = run_batch(engine, mixed_jobs(engine, fast_draft))
    assert [r.token_ids for r in got] == [r.token_ids for r in eager]
    assert counters["stats"]["unique_graphs"] == traced  # nothing traced here


def test_a_helper_that_fails_says_so(tmp_path, caplog) -> None:
    job = Job(str(tmp_path / "no-model"), "cpu", "float32", False, False, 4, False)
    with caplog.at_level(logging.INFO, logger="gateway.engine.precompile"):
        assert not start([job], tmp_path / "store").wait(120)
    assert "compile helper failed (exit 1)" in caplog.text
    assert "compile helper: " in caplog.text  # its output (the traceback) is in the log
    assert not list(tmp_path.glob("store/step-*.pt"))
