"""The compiled batch step (speed/compiled.py) decodes what the eager one decodes.

A mixed batch (standard, draft, prompt lookup, a grammar row, rows joining late) runs once
eager and once compiled on the same weights; greedy outputs must agree token for token in
fp32, and every step must have run through a handful of compiled graphs (dynamic shapes),
not one graph per shape. The steps kept in a store between starts:
test_compiled_store.py.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from torch._dynamo.utils import counters

from gateway.engine import DecodeResult, Engine, LoadedModel
from gateway.engine.batch.forward import Step, batched_forward
from gateway.speed import load_fast, packed_linear, wrap_fast
from gateway.speed.compiled import CompiledForwards
from gateway.speed.fast import Accelerated, compiled_of, lean_of
from gateway.speed.kinds import FASTER, MAX_PREFILL, MAX_TOKENS
from gateway.speed.warmup import (
    CompileOptions,
    compiled_model,
    faster_kinds,
    with_compiled,
)
from tests.support.batch import draft_jobs, drive, mixed_jobs, run_batch
from tests.support.models import llama

pytestmark = [
    pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile is not available"),
    pytest.mark.compile,
]


@pytest.mark.parametrize(("arch", "weight_major"), [("llama", False), ("llama", True)])
def test_a_compiled_batch_decodes_what_the_eager_batch_decodes(
    model_dirs, arch, weight_major
) -> None:
    """With the weight-major linear too: its several-row products are then the packed op
    (packed_linear.py), which must find each weight's pack and not pack it again."""
    target = load_fast(model_dirs[arch], device="cpu", cpu_linear=weight_major)
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=weight_major)
    eager = run_batch(Engine(target), mixed_jobs(Engine(target), draft))

    graphs = counters["stats"]["unique_graphs"]
    fast_target, _ = compiled_model(target, 8)
    fast_draft, _ = compiled_model(draft, 8, draft=True)
    warm = counters["stats"]["unique_graphs"]
    engine = Engine(fast_target)
    got = run_batch(engine, mixed_jobs(engine, fast_draft))

    for a, b in zip(eager, got, strict=True):
        assert b.token_ids == a.token_ids
    # the warm-up compiled a handful of graphs (one row x one token, one row x several
    # tokens, several rows x one, several x several; for the target's verify and the
    # draft's drafting step), and
    # the batch, whatever its lengths and row counts, compiled nothing more
    assert 0 < warm - graphs <= 8
    assert counters["stats"]["unique_graphs"] == warm
    packs = packed_linear.KERNEL.packs_made()
    again = run_batch(engine, mixed_jobs(engine, fast_draft))
    assert [r.token_ids for r in again] == [r.token_ids for r in got]
    assert packed_linear.KERNEL.packs_made() == packs  # every pack found again, none per call
    # the compiled steps called the packed op: their joined projections, which only they
    # use, have packs; without the weight-major linear they have none
    assert lean_of(fast_target) is not None and lean_of(fast_target).joined is not None
    joined = [w for j in lean_of(fast_target).joined for w in (j.qkv.weight, j.gate_up.weight)]
    has_pack = {packed_linear.KERNEL.has_pack(w) for w in joined}
    assert has_pack == {weight_major and packed_linear.AVAILABLE}


def test_a_compiled_draft_runs_its_reduced_head_in_its_step_and_drafts_what_eager_drafts(
    model_dirs, tokenizer
) -> None:
    """A draft with a reduced head compiles the head into its drafting step: its logits
    come out of the step -inf outside the subset, and each row drafts, and has accepted,
    what the eager draft gives. The draft is the target's own model drafting among half
    the vocabulary: it is accepted exactly where the target's choice lies in the subset
    (through the full head it would be accepted everywhere)."""
    from gateway.speed.warmup import _scratch

    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    subset = list(range(0, len(tokenizer), 2))
    draft = wrap_fast(target.model, tokenizer, draft_vocab=subset, cpu_linear=False)
    engine = Engine(target)
    eager = run_batch(engine, draft_jobs(draft))
    fast, _ = compiled_model(draft, 8, draft=True)
    assert compiled_of(fast) is not None and compiled_of(fast).head is draft.draft_head
    got = run_batch(engine, draft_jobs(fast))
    for a, b in zip(eager, got, strict=True):
        assert b.token_ids == a.token_ids
        assert (b.stats.drafted, b.stats.accepted) == (a.stats.drafted, a.stats.accepted)
    assert 0 < sum(r.stats.accepted for r in got) < sum(r.stats.drafted for r in got)
    outside = torch.ones(len(tokenizer), dtype=torch.bool)
    outside[subset] = False
    with torch.inference_mode():
        outs = []
        for compiled in (None, compiled_of(fast)):
            cache, slots = _scratch(fast, [[3, 4, 5], [6, 7]])
            cache.length[slots[0]], cache.length[slots[1]] = 3, 2
            outs.append(
                batched_forward(
                    fast.model,
                    Step(cache, slots, [[8], [9]], keep_last=True, head=fast.draft_head),
                    Accelerated(lean_of(fast), compiled),
                )
            )
    for a, b in zip(*outs, strict=True):
        assert b.shape == (1, len(tokenizer)) and torch.isneginf(b[0, outside]).all()
        torch.testing.assert_close(b[0, ~outside], a[0, ~outside], rtol=1e-5, atol=1e-5)


def test_each_kind_traces_one_layer_and_reuses_its_code_for_the_others(tokenizer) -> None:
    """The step's layers are one nested compile region: per kind of step, torch traces the
    first layer and stamps the others out of it (what halves a cold compile), also for a
    third model compiled in the process, and the compiled step gives the eager lean
    decoder's logits (to rounding: fused kernels, another attention kernel)."""
    from torch._dynamo.utils import compilation_time_metrics as timed

    from gateway.speed.warmup import _scratch

    def model(seed: int, layers: int) -> LoadedModel:
        return wrap_fast(llama(len(tokenizer), tokenizer.eos_token_id, seed, layers), tokenizer)

    for layers in (1, 2):  # two other models' steps first: 8 compiled entries, torch's
        compiled_model(model(6, layers), 4)  # limit per function (each step has its own)
    lm = model(5, 3)
    keys = ("invoke_subgraph_trace", "invoke_subgraph_reuse_stamp_out")
    before = [len(timed.get(k, [])) for k in keys]
    fast, _ = compiled_model(lm, 4)
    traced, stamped = (len(timed.get(k, [])) - n for k, n in zip(keys, before, strict=True))
    assert (traced, stamped) == (4, 4 * 2)  # 4 kinds, 3 layers each
    with torch.inference_mode():
        caches = [_scratch(fast, [[3, 4, 5], [6, 7], [8, 9, 10, 11]]) for _ in range(2)]
        for feeds in ([[12]], [[13, 14]], [[15], [16], [17]], [[18, 19], [20, 21], [22, 23]]):
            outs = []
            for (cache, slots), compiled in zip(caches, (None, compiled_of(fast)), strict=True):
                for s, n in zip(slots, (3, 2, 4), strict=True):
                    cache.length[s] = n
                outs.append(
                    batched_forward(
                        lm.model,
                        Step(cache, slots[: len(feeds)], feeds),
                        Accelerated(lean_of(lm), compiled),
                    )
                )
            for a, b in zip(*outs, strict=True):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        # on a CPU a one-token step attends with the plain products inductor fuses, not
        # torch's SDPA kernel (compiled._family: its fixed cost a call is what it saves);
        # one row's products are generated reductions, not torch's mm with its input copy
        # (compiled.INDUCTOR)
        cache, slots = caches[1]
        ops = []
        for feeds in ([[24], [25], [26]], [[27]]):
            with torch.profiler.profile() as prof:
                batched_forward(
                    lm.model,
                    Step(cache, slots[: len(feeds)], feeds),
                    Accelerated(lean_of(lm), compiled_of(fast)),
                )
            ops.append({e.name for e in prof.events()})
            assert not [n for n in ops[-1] if "scaled_dot_product" in n]
        assert "aten::mm" in ops[0]  # three rows: torch's mm
        assert not {"aten::mm", "aten::clone"} & ops[1]  # one row


def test_a_step_runs_compiled_only_for_the_kinds_kept() -> None:
    fast = CompiledForwards(lambda *a: None, keep_last=False, kinds=frozenset({"Bx1"}))
    assert fast.serves(4, 1, keep_last=False, backbone=False, head=None)
    assert not fast.serves(4, 3, keep_last=False, backbone=False, head=None)  # BxN not kept
    assert not fast.serves(1, 3, keep_last=False, backbone=False, head=None)  # 1xN not kept
    assert not fast.serves(1, 1, keep_last=False, backbone=False, head=None)  # 1x1 not kept
    assert not fast.serves(4, 1, keep_last=False, backbone=True, head=None)  # hidden states
    # a prefill chunk (keep_last) on the target's step, where its head is cheap: every
    # position computed, the caller keeps each row's last; up to MAX_PREFILL tokens, of a
    # kind kept
    assert not fast.serves(4, 1, keep_last=True, backbone=False, head=None)  # prefill_all off
    fast = replace(fast, prefill_all=True)
    assert fast.serves(4, 1, keep_last=True, backbone=False, head=None)
    assert fast.prefills_all(True) and not fast.prefills_all(False)
    wide = CompiledForwards(
        lambda *a: None, keep_last=False, kinds=frozenset({"1xN"}), prefill_all=True
    )
    assert wide.serves(1, MAX_PREFILL, keep_last=True, backbone=False, head=None)
    assert not wide.serves(1, MAX_PREFILL + 1, keep_last=True, backbone=False, head=None)
    assert not wide.serves(1, MAX_TOKENS + 1, keep_last=False, backbone=False, head=None)
    # a draft's step (the last position) serves its prefill chunks, never every position
    draft = CompiledForwards(lambda *a: None, keep_last=True, kinds=frozenset({"1xN"}))
    assert draft.serves(1, MAX_PREFILL, keep_last=True, backbone=False, head=None)
    assert not draft.prefills_all(True)
    assert not draft.serves(1, 3, keep_last=False, backbone=False, head=None)  # another use
    assert faster_kinds({"1xN": 1.01, "Bx1": 0.8, "BxN": FASTER}) == {"Bx1", "BxN"}


def test_auto_keeps_the_kinds_it_measured_faster_and_decodes_what_eager_decodes(
    model_dirs,
) -> None:
    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=False)
    eager = run_batch(Engine(target), mixed_jobs(Engine(target), draft))

    said: list[str] = []
    fast, _ = compiled_model(target, 4, options=CompileOptions(measure=True), progress=said.append)
    ratios = dict(
        (k, float(r)) for k, r in re.findall(r"(1x1|1xN|Bx1|BxN) ([0-9.]+)", said[-1])
    )  # the log line gives compiled/eager per kind: all three were measured
    assert set(ratios) == {"1x1", "1xN", "Bx1", "BxN"} and all(r > 0 for r in ratios.values())
    kept = compiled_of(fast).kinds if compiled_of(fast) is not None else frozenset()
    assert kept == faster_kinds(ratios)
    # whatever this machine kept, a batch with only some kinds compiled (here: every
    # multi-row step compiled, one-row steps eager) decodes what eager decodes
    compiled = compiled_of(compiled_model(target, 8)[0])  # run_batch's rows: its buffers' shape
    assert compiled is not None
    part = with_compiled(target, replace(compiled, kinds=frozenset({"Bx1", "BxN"})))
    engine = Engine(part)
    got = run_batch(engine, mixed_jobs(engine, draft))
    for a, b in zip(eager, got, strict=True):
        assert b.token_ids == a.token_ids


def test_a_target_serves_prefill_chunks_only_where_its_head_is_small_against_its_layers(
    model_dirs, monkeypatch
) -> None:
    """Every position's logits cost the head's product per token: a target whose head has
    more than HEAD_SHARE of its layers' weights keeps eager prefills; a draft's step (the
    last position) serves its own either way."""
    from gateway.speed import compiled

    lm = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    assert lean_of(lm) is not None
    head = lm.model.get_output_embeddings().weight.numel()
    share = head / sum(p.numel() for p in lm.model.base_model.layers.parameters())
    for bound, served in ((share * 1.01, True), (share * 0.99, False)):
        monkeypatch.setattr(compiled, "HEAD_SHARE", bound)
        fast = compiled.compile_forwards(lean_of(lm), keep_last=False, inductor=False)
        assert fast.prefill_all is served
        assert fast.serves(1, 40, keep_last=True, backbone=False, head=None) is served
        draft = compiled.compile_forwards(lean_of(lm), keep_last=True, inductor=False)
        assert not draft.prefill_all
        assert draft.serves(1, 40, keep_last=True, backbone=False, head=None)


def test_a_one_row_batch_is_served_by_the_steps_its_start_compiled(model_dirs, tmp_path) -> None:
    """GATEWAY_MAX_BATCH=1: the warm-up compiles the one-row kinds on a one-slot cache, as
    the batch's is (a one-slot buffer is a size torch specialises), so serving traces
    nothing and the precompiled steps' guards accept every step."""
    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=False)

    def one_by_one(engine: Engine, draft: LoadedModel) -> list[DecodeResult]:
        batch = engine.batch(1)
        return [drive(batch, engine, [replace(j, join_at=0)])[0] for j in mixed_jobs(engine, draft)]

    eager = one_by_one(Engine(target), draft)

    fast_target, _ = compiled_model(target, 1, options=CompileOptions(store=tmp_path))
    fast_draft, _ = compiled_model(draft, 1, draft=True, options=CompileOptions(store=tmp_path))
    steps = [compiled_of(fast_target).step, compiled_of(fast_draft).step]  # type: ignore[union-attr]
    assert all(sorted(s.fns) == ["1x1", "1xN"] for s in steps)  # no multi-row kind
    traced = counters["stats"]["unique_graphs"]
    engine = Engine(fast_target)
    got = one_by_one(engine, fast_draft)
    assert [r.token_ids for r in got] == [r.token_ids for r in eager]
    assert counters["stats"]["unique_graphs"] == traced  # no just-in-time compile
    assert all(f is not None for s in steps for f in s.fns.values())


def test_a_several_token_step_over_scattered_slots_reads_each_rows_own_keys(
    model_dirs,
) -> None:
    """A compiled step of several tokens a row reads the rows' keys as one view of a slot
    range (speed/compiled.py `_layer`), so rows in slots out of order and with gaps are
    arranged, a filler row in each gap (batch/forward.py `contiguous_rows`). Each row's
    logits must be the eager forward's, in the caller's row order, and the gaps' slots must
    keep their committed keys."""
    from gateway.engine.batch.slots import SlotCache, slot_pad

    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    fast, _ = compiled_model(target, 4)
    layers = int(target.model.config.num_hidden_layers)
    cache = SlotCache(layers, 4, target.context_length, pad=slot_pad())
    slots = [cache.take() for _ in range(4)]
    prompts = [[3, 5, 7, 9, 11], [4, 6], [8, 10, 12, 14, 16, 18, 20], [13, 15, 17]]
    with torch.inference_mode():
        for slot, ids in zip(slots, prompts, strict=True):  # eager prefill, committed
            batched_forward(target.model, Step(cache, [slot], [ids]), Accelerated(lean_of(target)))
            cache.length[slot] = len(ids)
        keys, _ = cache.buffers()
        kept = {s: keys[0][s, :, : cache.length[s]].clone() for s in (1, 2)}
        rows, feeds = [3, 0], [[21, 22, 23], [24, 25]]  # out of order, slots 1 and 2 a gap
        got = batched_forward(
            target.model, Step(cache, rows, feeds), Accelerated(lean_of(target), compiled_of(fast))
        )
        want = batched_forward(target.model, Step(cache, rows, feeds), Accelerated(lean_of(target)))
    for g, w, f in zip(got, want, feeds, strict=True):
        assert g.shape == w.shape == (len(f), w.shape[-1])
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    for s, before in kept.items():
        assert torch.equal(keys[0][s, :, : cache.length[s]], before)
