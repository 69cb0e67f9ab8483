"""The compiled batch step (engine/compiled.py) decodes what the eager one decodes.

A mixed batch (standard, draft, prompt lookup, a grammar row, rows joining late) runs once
eager and once compiled on the same weights; greedy outputs must agree token for token in
fp32, and every step must have run through a handful of compiled graphs (dynamic shapes),
not one graph per shape.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from gateway.engine import Engine, load_model
from gateway.engine.compiled import compiled_model

from .test_batch import mixed_jobs, run_batch

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "compile"), reason="torch.compile is not available"
)


@pytest.mark.parametrize("arch", ["llama"])
def test_a_compiled_batch_decodes_what_the_eager_batch_decodes(model_dirs, arch) -> None:
    target = load_model(model_dirs[arch], device="cpu", cpu_linear=False)
    draft = load_model(model_dirs["draft"], device="cpu", cpu_linear=False)
    eager = run_batch(Engine(target), mixed_jobs(Engine(target), draft))

    graphs = counters["stats"]["unique_graphs"]
    fast_target, _ = compiled_model(target, 8)
    fast_draft, _ = compiled_model(draft, 8, draft=True)
    warm = counters["stats"]["unique_graphs"]
    engine = Engine(fast_target)
    got = run_batch(engine, mixed_jobs(engine, fast_draft))

    for a, b in zip(eager, got, strict=True):
        assert b.token_ids == a.token_ids
    # the warm-up compiled a handful of graphs (one row x several tokens, several rows x
    # one, several x several; for the target's verify and the draft's drafting step), and
    # the batch, whatever its lengths and row counts, compiled nothing more
    assert 0 < warm - graphs <= 6
    assert counters["stats"]["unique_graphs"] == warm
