"""The bucketed, captured batch step (speed/graphs.py).

On the CPU the bucketed step runs without capturing (the same padding, layout and in-graph
mask a CUDA graph records); on CUDA the graphs are captured and replayed. Either way a
mixed batch must decode what the eager batch decodes, and padding must leave every real
key and value where it was.
"""

from __future__ import annotations

import pytest
import torch

from gateway.engine import Engine, LoadedModel
from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.batch.slots import SlotCache
from gateway.engine.models import cache_kwarg
from gateway.speed import load_fast
from gateway.speed.fast import Accelerated, compiled_of, lean_of
from gateway.speed.graphs import MIN_SPAN, bucket
from gateway.speed.kinds import KINDS
from gateway.speed.warmup import CompileOptions, compiled_model
from tests.support.batch import mixed_jobs, run_batch

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_buckets_are_powers_of_two_up_to_the_limit() -> None:
    assert [bucket(n, 8) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert bucket(6, 6) == 6 and bucket(7, 6) == 6  # the limit is a bucket of its own
    assert [bucket(n, 2176, MIN_SPAN) for n in (1, 64, 65, 1500, 2100)] == [
        64, 64, 128, 2048, 2176,
    ]  # fmt: skip


def _graphed(lm: LoadedModel, draft: bool = False) -> LoadedModel:
    fast, _ = compiled_model(
        lm, 8, draft=draft, options=CompileOptions(inductor=False, graphs=True)
    )
    assert compiled_of(fast) is not None and compiled_of(fast).graphs is not None
    assert compiled_of(fast).kinds == KINDS  # one row x one token too
    return fast


def test_a_bucketed_batch_decodes_what_the_eager_batch_decodes(model_dirs) -> None:
    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=False)
    eager = run_batch(Engine(target), mixed_jobs(Engine(target), draft))
    engine = Engine(_graphed(target))
    got = run_batch(engine, mixed_jobs(engine, _graphed(draft, draft=True)))
    assert [r.token_ids for r in got] == [r.token_ids for r in eager]
    graphs = compiled_of(engine.target).graphs  # type: ignore[union-attr]
    assert graphs is not None and not graphs.capture and graphs.captures == 0  # CPU: none


def _filled(lm: LoadedModel, lengths: list[int]) -> tuple[SlotCache, list[int]]:
    cache = SlotCache(int(lm.model.config.num_hidden_layers), 4, 64, pad=20)
    slots = [cache.take() for _ in lengths]
    feeds = [[1 + (5 * s + j) % 50 for j in range(n)] for s, n in enumerate(lengths)]
    with torch.inference_mode():
        batched_forward(
            lm.model, Step(cache, slots, feeds, keep_last=True), Accelerated(lean_of(lm))
        )
    for s, n in zip(slots, lengths, strict=True):
        cache.length[s] = n
    return cache, slots


def test_padding_writes_nothing_a_real_row_reads(model_dirs) -> None:
    """A step of 3 rows x 3 tokens pads to 4 x 4: the filler row and the filler tokens
    write only past a row's fed positions (the filler row past the slot's capacity), and
    the real rows' logits and keys agree with the eager step's."""
    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    fast = _graphed(target)
    lengths = [5, 9, 2, 7]
    feeds = [[3, 4, 5], [6], [7, 8]]  # rows 0-2 step; slot 3 stays out of it
    ref_cache, slots = _filled(target, lengths)
    cache, _ = _filled(target, lengths)
    before = [k.clone() for k in cache.buffers()[0]]
    cache_kwarg(target.model)
    with torch.inference_mode():
        ref = batched_forward(
            target.model, Step(ref_cache, slots[:3], feeds), Accelerated(lean_of(target))
        )
        got = batched_forward(
            target.model,
            Step(cache, slots[:3], feeds),
            Accelerated(lean_of(target), compiled_of(fast)),
        )
    for a, b in zip(ref, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    for layer, (old, new, eager) in enumerate(
        zip(before, cache.buffers()[0], ref_cache.buffers()[0], strict=True)
    ):
        for s, n in enumerate(lengths):
            fed = len(feeds[s]) if s < 3 else 0
            assert torch.equal(new[s, :, :n], old[s, :, :n]), f"layer {layer} slot {s}"
            torch.testing.assert_close(new[s, :, n : n + fed], eager[s, :, n : n + fed])
            untouched = new[s, :, n + 4 : cache.capacity]  # past the padded width of 4
            assert torch.equal(untouched, old[s, :, n + 4 : cache.capacity])


@cuda
@pytest.mark.parametrize("inductor", [False, True])
def test_captured_graphs_on_cuda_decode_what_eager_decodes(model_dirs, inductor) -> None:
    """fp32 on the GPU: a mixed batch through captured graphs (the eager lean step, and the
    inductor-compiled one, inside them) against the eager batch; padding changes the
    products' shapes, so any parting must be a near tie."""
    target = load_fast(model_dirs["llama"], device="cuda", dtype=torch.float32)
    draft = load_fast(model_dirs["draft"], device="cuda", dtype=torch.float32)
    eager = run_batch(Engine(target), mixed_jobs(Engine(target), draft))
    fast_target, _ = compiled_model(
        target, 8, options=CompileOptions(inductor=inductor, graphs=True)
    )
    fast_draft, _ = compiled_model(
        draft, 8, draft=True, options=CompileOptions(inductor=inductor, graphs=True)
    )
    engine = Engine(fast_target)
    jobs = mixed_jobs(engine, fast_draft)
    got = run_batch(engine, jobs)
    graphs = compiled_of(fast_target).graphs  # type: ignore[union-attr]
    assert graphs is not None and graphs.capture and graphs.captures > 0
    for job, a, b in zip(jobs, eager, got, strict=True):
        if a.token_ids != b.token_ids:
            pairs = enumerate(zip(a.token_ids, b.token_ids, strict=False))
            shorter = min(len(a.token_ids), len(b.token_ids))
            j = next((i for i, (x, y) in pairs if x != y), shorter)
            ids = torch.tensor([list(job.req.prompt_ids) + a.token_ids[:j]], device="cuda")
            with torch.no_grad():
                top2 = target.model(input_ids=ids).logits[0, -1].float().topk(2).values
            assert float(top2[0] - top2[1]) < 1e-4, f"outputs part at {j} without a near tie"


def test_a_bucket_that_cannot_be_recorded_turns_graphs_off_and_runs_eager(
    model_dirs, monkeypatch, caplog
) -> None:
    from gateway.speed.graphs import GraphedSteps

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("operation not permitted when stream is capturing")

    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=False)
    eager = run_batch(Engine(target), mixed_jobs(Engine(target), draft))
    monkeypatch.setattr(GraphedSteps, "_record", broken)
    engine = Engine(_graphed(target))
    got = run_batch(engine, mixed_jobs(engine, _graphed(draft, draft=True)))
    assert [r.token_ids for r in got] == [r.token_ids for r in eager]
    graphs = compiled_of(engine.target).graphs  # type: ignore[union-attr]
    assert graphs is not None and graphs.failed is not None
    assert not graphs.serves(1, 1, engine.batch(2).cache)
    assert "CUDA graphs off" in caplog.text


def test_a_step_whose_padded_width_would_pass_the_slot_pad_is_not_bucketed() -> None:
    from gateway.speed.graphs import GraphedSteps

    cpu = torch.device("cpu")
    graphs = GraphedSteps(lambda *a: None, 8, 16, cpu)  # type: ignore[arg-type, return-value]
    cache = SlotCache(1, 8, 64, pad=6)
    assert graphs.serves(8, 4, cache)  # 4 tokens: width 4, inside the pad of 6
    assert not graphs.serves(8, 5, cache)  # 5 tokens pad to 8: past the pad
    assert not graphs.serves(9, 1, cache)  # more rows than the graphs were built for
    assert not graphs.serves(1, 17, cache)  # a prefill chunk: eager
