"""A helper process compiles models' steps into the store (engine/precompile.py) and this
process loads them: the same fingerprints on both sides, so nothing is traced again."""

from __future__ import annotations

import logging

import pytest
from torch._dynamo.utils import counters

from gateway.engine import Engine
from gateway.speed import load_fast
from gateway.speed.fast import compiled_of
from gateway.speed.precompile import Job, claimer, start, take_last
from gateway.speed.warmup import CompileOptions, WarmShare, compiled_model
from tests.support.batch import mixed_jobs, run_batch

pytestmark = pytest.mark.compile

KINDS = ["1x1", "1xN", "Bx1", "BxN"]


def test_what_a_helper_compiled_loads_here_without_tracing(model_dirs, tmp_path) -> None:
    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    # the draft's linear forward was decided here (weight-major): the helper must load it so
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=True)
    eager = run_batch(Engine(target), mixed_jobs(Engine(target), draft))

    # the batch's rows (run_batch's 8): a step is compiled for its slot buffers' shape;
    # this process may take the draft's last kinds (claimed, so each is compiled once)
    jobs = [Job.of(target, 8, draft=False), Job.of(draft, 8, draft=True)]
    helper = start(jobs, tmp_path, models=[None, draft])
    helper.take_last()
    assert helper.wait(600)
    assert len(list(tmp_path.glob("step-*.pt"))) == 8
    assert not list(tmp_path.glob(".claims-*"))  # the claims folder went with the helper
    traced = counters["stats"]["unique_graphs"]
    fast_target, _ = compiled_model(target, 8, options=CompileOptions(store=tmp_path))
    fast_draft, _ = compiled_model(draft, 8, draft=True, options=CompileOptions(store=tmp_path))
    for fast in (fast_target, fast_draft):
        assert sorted(compiled_of(fast).step.loaded) == KINDS  # type: ignore[union-attr]
    engine = Engine(fast_target)
    got = run_batch(engine, mixed_jobs(engine, fast_draft))
    assert [r.token_ids for r in got] == [r.token_ids for r in eager]
    assert counters["stats"]["unique_graphs"] == traced  # nothing traced here


def test_a_helper_that_fails_says_so(tmp_path, caplog) -> None:
    job = Job(str(tmp_path / "no-model"), "cpu", "float32", False, False, 4, False)
    with caplog.at_level(logging.INFO, logger="gateway.speed.precompile"):
        assert not start([job], tmp_path / "store").wait(120)
    assert "compile helper failed (exit 1)" in caplog.text
    assert "compile helper: " in caplog.text  # its output (the traceback) is in the log
    assert not list(tmp_path.glob("store/step-*.pt"))


def test_a_kind_is_claimed_once(tmp_path) -> None:
    mine, theirs = claimer(tmp_path), claimer(tmp_path)
    assert mine("step-a-1x1.pt")
    assert not theirs("step-a-1x1.pt")  # the other process has it
    assert theirs("step-a-BxN.pt")
    assert not mine("step-a-BxN.pt")


def test_taking_the_last_kinds_stops_where_the_helper_is(model_dirs, tmp_path, caplog) -> None:
    """The gateway takes a helper's kinds from the last back and stops at the first one the
    helper claimed (it goes from the first on: those before are its own too); the taken
    ones are stored, the rest left to the helper (here nobody compiles them: the final
    load does, as after a dead helper)."""
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=True)
    store, claims = tmp_path / "store", tmp_path / "claims"
    claims.mkdir()
    at = "BxN"  # warm_up's order is 1xN, Bx1, BxN, 1x1: the helper is at its third kind
    helper = claimer(claims)
    # the helper claims that kind (by the name warm_up asks with) and compiles nothing
    compiled_model(
        draft,
        8,
        draft=True,
        options=CompileOptions(store=store),
        share=WarmShare(kinds=frozenset({at}), claim=lambda name: helper(name) and False),
    )
    assert len(list(claims.iterdir())) == 1 and not list(store.glob("step-*.pt"))
    with caplog.at_level(logging.INFO):
        taken = take_last([(draft, Job.of(draft, 8, draft=True))], store, claims)
    assert taken == 1  # 1x1, then BxN is the helper's: 1xN and Bx1 are not taken
    assert f"step kind {at} left to the other process" in caplog.text
    assert [p.stem.split("-")[-2] for p in store.glob("step-*.pt")] == ["1x1"]
    # what was taken loads (the kinds not taken would only compile here: the glob above
    # shows that none of them was stored)
    fast, _ = compiled_model(
        draft,
        8,
        draft=True,
        options=CompileOptions(store=store),
        share=WarmShare(kinds=frozenset({"1x1"})),
    )
    assert compiled_of(fast).step.loaded == ["1x1"]  # type: ignore[union-attr]


def test_a_kind_stored_by_an_earlier_start_is_passed_over(model_dirs, tmp_path) -> None:
    """A stored kind is not where the helper is (it may be an earlier start's): the taking
    goes on back past it, to the kinds before it, until the helper's claim."""
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=True)
    store, claims = tmp_path / "store", tmp_path / "claims"
    claims.mkdir()
    compiled_model(
        draft,
        8,
        draft=True,
        options=CompileOptions(store=store),
        share=WarmShare(kinds=frozenset({"1x1"})),
    )  # stored
    helper = claimer(claims)
    claimed = frozenset({"1xN"})  # the helper's: claimed, not compiled
    compiled_model(
        draft,
        8,
        draft=True,
        options=CompileOptions(store=store),
        share=WarmShare(kinds=claimed, claim=lambda name: helper(name) and False),
    )
    taken = take_last([(draft, Job.of(draft, 8, draft=True))], store, claims)
    assert taken == 2  # BxN and Bx1; 1x1 was stored, 1xN is the helper's
    assert sorted(p.stem.split("-")[-2] for p in store.glob("step-*.pt")) == ["1x1", "Bx1", "BxN"]
