"""The compiled batch step (engine/compiled.py) decodes what the eager one decodes.

A mixed batch (standard, draft, prompt lookup, a grammar row, rows joining late) runs once
eager and once compiled on the same weights; greedy outputs must agree token for token in
fp32, and every step must have run through a handful of compiled graphs (dynamic shapes),
not one graph per shape.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from gateway.engine import (
    DecodeRequest,
    DecodeResult,
    Engine,
    LoadedModel,
)
from gateway.engine.batch.forward import Step, batched_forward
from gateway.speed import cpu_linear, load_fast, packed_linear, wrap_fast
from gateway.speed.compiled import CompiledForwards
from gateway.speed.fast import Accelerated, compiled_of, lean_of
from gateway.speed.kinds import FASTER, MAX_PREFILL, MAX_TOKENS
from gateway.speed.warmup import (
    CompileOptions,
    WarmShare,
    compiled_model,
    faster_kinds,
    with_compiled,
)
from tests.support.batch import Job, draft_jobs, drive, greedy, mixed_jobs, run_batch
from tests.support.models import llama

pytestmark = [
    pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile is not available"),
    pytest.mark.compile,
]


@dataclass(frozen=True)
class Stored:
    """A target (torch's linear forward, or the weight-major one) compiled ahead of time for
    a batch of 4 rows into `store`, serving prefill chunks (HEAD_SHARE raised: the tiny
    model's head is large); with what its first start did, seen as it returned: the kinds
    it loaded (none: the store was empty), the step files it saved, the kinds that fell
    back to the jit, and the graphs torch had traced when it returned."""

    target: LoadedModel
    fast: LoadedModel
    store: Path
    loaded: list[str]
    saved: int
    fell_back: list[str]
    traced: int


@pytest.fixture(scope="module")
def stored_targets(model_dirs, tmp_path_factory) -> Iterator[Callable[[bool], Stored]]:  # type: ignore[no-untyped-def]
    """Each target compiled once (by weight_major), on first use, for the tests that serve
    with such a step, need one in a store, or check what compiling and saving one did (a
    compile ahead of time costs tens of seconds, and its artifacts bypass inductor's
    cache); the other tests of compiling and saving compile their own. Its tests are one
    unit of work under pytest-xdist (tests/conftest.py GROUPS): one worker compiles each."""
    from gateway.speed import compiled as compiled_module
    from gateway.speed.store import Precompiled

    built: dict[bool, Stored] = {}

    def get(weight_major: bool) -> Stored:
        if weight_major not in built:
            store = tmp_path_factory.mktemp("stored-target")
            target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=weight_major)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(compiled_module, "HEAD_SHARE", 10.0)  # it serves prefill chunks
                fast, _ = compiled_model(target, 4, options=CompileOptions(store=store))
            assert compiled_of(fast) is not None and isinstance(compiled_of(fast).step, Precompiled)
            step = compiled_of(fast).step
            built[weight_major] = Stored(
                target, fast, store, list(step.loaded), len(list(store.glob("step-*.pt"))),
                [k for k, fn in step.fns.items() if fn is None],
                counters["stats"]["unique_graphs"],
            )  # fmt: skip
        return built[weight_major]

    yield get


@pytest.fixture
def stored_target(stored_targets: Callable[[bool], Stored]) -> Stored:
    """torch's linear forward's (`stored_targets`)."""
    return stored_targets(False)


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
    from gateway.engine.batch.forward import Step, batched_forward
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

    from gateway.engine.batch.forward import Step, batched_forward
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


def test_a_step_whose_keys_span_one_position_runs_eager(stored_target: Stored) -> None:
    """A 2-token prompt prefills one token at position 0: a key span of 1, which no traced
    step takes (torch specialises sizes of 1; a precompiled step's guards refuse it and the
    jit would trace anew): it runs eager, on a batch whose step is compiled."""
    from gateway.speed.store import Precompiled

    fast = stored_target.fast  # compiled ahead of time, serving prefill chunks
    assert compiled_of(fast) is not None and compiled_of(fast).prefill_all
    assert compiled_of(fast) is not None and isinstance(compiled_of(fast).step, Precompiled)
    warm = counters["stats"]["unique_graphs"]
    engine = Engine(fast)
    batch = engine.batch(4)
    reqs = [DecodeRequest((5, 9, 11), greedy(3)), DecodeRequest((7, 4), greedy(3))]
    got = drive(batch, engine, [Job(0, reqs[0]), Job(2, reqs[1])])
    assert [r.token_ids for r in got] == [engine.run(r).token_ids for r in reqs]
    assert not compiled_of(fast).step.refused
    assert counters["stats"]["unique_graphs"] == warm


@pytest.mark.parametrize("weight_major", [False, True])
def test_prefill_chunks_run_the_compiled_step_its_guards_accept_and_decode_as_eager(
    model_dirs, tmp_path, monkeypatch, weight_major, stored_targets
) -> None:
    """Prompts of 63 and 90 tokens (above the decode steps' MAX_TOKENS), two arriving
    together and one alone, prefill through the target's precompiled step (every position
    computed, each row's last kept) and the draft's: no new graph, no call its guards
    refuse, and the same greedy tokens as eager. With the weight-major linear too, whose
    products of more than cpu_linear.ROWS_MAX rows (the pair's chunk: 2 x 89) must not be
    a shape the step's guards refuse."""
    from gateway.speed import compiled as compiled_module
    from gateway.speed.store import Precompiled

    shared: Stored = stored_targets(weight_major)  # the target, compiled ahead of time
    target = shared.target  # for 4 rows, serving prefill chunks (HEAD_SHARE raised)
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=weight_major)
    prompts = [tuple((i * 7 + r) % 200 + 3 for i in range(n)) for r, n in enumerate((41, 90, 63))]
    spec = {"mode": "speculative", "k_min": 1, "k_max": 4}

    def jobs(d: LoadedModel) -> list[Job]:
        return [
            Job(0, DecodeRequest(prompts[0], greedy(6))),
            Job(2, DecodeRequest(prompts[1], greedy(6), proposer="draft", **spec), d),
            Job(2, DecodeRequest(prompts[2], greedy(6))),
            Job(5, DecodeRequest(prompts[2], greedy(6), proposer="draft", **spec), d),
        ]

    eager = drive(Engine(target).batch(4), Engine(target), jobs(draft))
    monkeypatch.setattr(compiled_module, "HEAD_SHARE", 10.0)  # the tiny model's head is large
    fast_target = shared.fast
    assert compiled_of(fast_target) is not None and compiled_of(fast_target).prefill_all
    fast_draft, _ = compiled_model(draft, 4, draft=True, options=CompileOptions(store=tmp_path))
    widths: list[int] = []
    call = Precompiled.__call__

    def spy(self: Precompiled, *args: torch.Tensor) -> torch.Tensor:
        widths.append(int(args[0].shape[2]))
        return call(self, *args)

    monkeypatch.setattr(Precompiled, "__call__", spy)
    warm = counters["stats"]["unique_graphs"]
    engine = Engine(fast_target)
    got = drive(engine.batch(4), engine, jobs(fast_draft))
    assert [r.token_ids for r in got] == [r.token_ids for r in eager]
    assert counters["stats"]["unique_graphs"] == warm  # no new graph
    # (the batch's first forward allocates its cache, eager) the pair's chunk, padded to
    # the longer, then a lone arrival's beside rows decoding
    assert {89, 62} <= set(widths)
    assert cpu_linear.ROWS_MAX < 2 * 89  # the pair's chunk: more rows than ROWS_MAX
    for fast in (fast_target, fast_draft):
        assert compiled_of(fast) is not None and isinstance(compiled_of(fast).step, Precompiled)
        assert not compiled_of(fast).step.refused
    # what a prefill returns: each row's last position, as eager's
    assert compiled_of(fast_target) is not None
    layers = int(target.model.config.num_hidden_layers)
    cache = compiled_of(fast_target).slot_cache(layers, fast_target.context_length)
    slots, feeds = [cache.take(), cache.take()], [list(prompts[0][:40]), list(prompts[1][:70])]
    out: dict[bool, list[torch.Tensor]] = {}
    # the step leaves the head to the caller, who multiplies each row's last position only
    head = compiled_of(fast_target).outer_head
    assert head is not None
    headed: list[tuple[int, ...]] = []

    def counted(h: torch.Tensor) -> torch.Tensor:
        headed.append(tuple(h.shape))
        return head(h)

    step = replace(compiled_of(fast_target), outer_head=counted)
    with torch.inference_mode():
        for compiled in (False, True):  # eager first: the cache's first forward allocates it
            cache.length[slots[0]] = cache.length[slots[1]] = 0
            out[compiled] = batched_forward(
                target.model,
                Step(cache, slots, feeds, keep_last=True),
                Accelerated(lean_of(fast_target), step if compiled else None),
            )
    assert widths[-1] == 70
    assert headed == [(2, target.model.config.hidden_size)]
    for a, b in zip(out[True], out[False], strict=True):
        assert a.shape == b.shape == (1, target.vocab_size)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("weight_major", [False, True])
def test_a_precompiled_step_is_saved_then_loaded_without_tracing(
    model_dirs, weight_major, stored_targets
) -> None:
    """With a store, the first start compiles each kind ahead of time and saves it; the
    next start loads every kind from the store, traces nothing, and decodes what eager
    decodes; with torch's linear forward and with the weight-major one (a bound method the
    artifact refers to by name). The first start is `stored_targets`' (what it did, seen as
    it returned), the batch its 4 rows: the first four of the mixed jobs."""
    from gateway.speed.store import Precompiled

    first = stored_targets(weight_major)
    target, store = first.target, first.store
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=False)

    def jobs(engine: Engine) -> list[Job]:
        return mixed_jobs(engine, draft)[:4]  # at most 4 rows at a time

    eager = run_batch(Engine(target), jobs(Engine(target)), max_rows=4)

    assert first.loaded == [] and first.saved == 4
    assert first.fell_back == []  # none fell back
    assert len(list(store.glob("step-*.pt"))) == 4
    traced = counters["stats"]["unique_graphs"]
    again, _ = compiled_model(target, 4, options=CompileOptions(store=store))
    assert compiled_of(again) is not None and isinstance(compiled_of(again).step, Precompiled)
    assert compiled_of(again).step is not compiled_of(first.fast).step  # type: ignore[union-attr]
    assert sorted(compiled_of(again).step.loaded) == ["1x1", "1xN", "Bx1", "BxN"]
    assert counters["stats"]["unique_graphs"] == traced  # nothing traced on the restart
    engine = Engine(again)
    got = run_batch(engine, jobs(engine), max_rows=4)
    assert [r.token_ids for r in got] == [r.token_ids for r in eager]
    assert counters["stats"]["unique_graphs"] == traced  # served by the loaded kinds


def test_a_call_a_precompiled_step_refuses_runs_just_in_time_and_the_log_says_so_once(
    tmp_path, caplog
) -> None:
    """A step its artifact's guards refuse (a shape it was not traced for) is served by the
    just-in-time compile, which stalls serving while it compiles: the log says so, once per
    kind, not once per step."""
    import logging

    from gateway.speed.store import Precompiled

    class Artifact:  # accepts up to 4 tokens a row
        def guard_check(self, inputs: torch.Tensor, *rest: object) -> bool:
            return inputs.shape[2] <= 4

        def __call__(self, *args: object) -> str:
            return "artifact"

    step = Precompiled(None, lambda *args: "jit", None, None, tmp_path, "x")  # type: ignore[arg-type]
    step.fns["1xN"] = Artifact()
    keys, values = [torch.zeros(2, 1, 8, 4)], [torch.zeros(2, 1, 8, 4)]
    with caplog.at_level(logging.WARNING, "gateway.speed.compiled"):
        got = [
            step(
                torch.zeros(6, 1, t, dtype=torch.long),
                torch.arange(5),
                torch.zeros(2),
                keys,
                values,
            )
            for t in (3, 5, 6, 4)
        ]
    assert got == ["artifact", "jit", "jit", "artifact"]
    said = [r.getMessage() for r in caplog.records if "guards refuse" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("step kind 1xN") and "(6, 1, 5)" in said[0]


def test_a_precompiled_step_checks_its_guards_once_per_shape_span_class_and_cache(
    tmp_path,
) -> None:
    """Guard checks cost more than the one-row step's Python around them, so a call whose
    `_call_key` passed before skips them: the same rows and tokens, a key span of 2 or
    more inside the buffers, the same slot buffers, the same grad and inference mode. Any
    other call is checked, and one the guards refuse is served just in time."""
    from gateway.speed.store import Precompiled

    checked: list[tuple[int, ...]] = []

    class Artifact:  # refuses a span of one key, or buffers of 6 positions
        def guard_check(self, inputs, span, base, keys, values) -> bool:  # type: ignore[no-untyped-def]
            checked.append((inputs.shape[1], span.shape[0], keys[0].shape[2]))
            return span.shape[0] > 1 and keys[0].shape[2] == 8

        def __call__(self, *args: object) -> str:
            return "artifact"

    step = Precompiled(None, lambda *args: "jit", None, None, tmp_path, "x")  # type: ignore[arg-type]
    step.fns["1x1"], step.fns["Bx1"] = Artifact(), Artifact()
    one, two = torch.zeros(6, 1, 1, dtype=torch.long), torch.zeros(6, 2, 1, dtype=torch.long)
    buffers = [torch.zeros(2, 1, 8, 4)], [torch.zeros(2, 1, 8, 4)]
    small = [torch.zeros(2, 1, 6, 4)], [torch.zeros(2, 1, 6, 4)]
    base = torch.zeros(2)

    def call(
        inputs: torch.Tensor, span: int, kv: tuple[list[torch.Tensor], list[torch.Tensor]]
    ) -> str:
        return step(inputs, torch.arange(span), base, *kv)  # type: ignore[return-value]

    with torch.inference_mode():
        got = [
            call(one, 5, buffers), call(one, 6, buffers), call(one, 7, buffers),  # checked once
            call(two, 5, buffers), call(two, 6, buffers),  # other rows: checked once
            call(one, 1, buffers), call(one, 1, buffers),  # one key: checked every time
            call(one, 8, buffers),  # past the buffers' positions: checked
            call(one, 5, small), call(one, 5, small),  # other buffers: checked, refused
        ]  # fmt: skip
    assert got == ["artifact"] * 5 + ["jit", "jit", "artifact", "jit", "jit"]
    assert checked == [(1, 5, 8), (2, 5, 8), (1, 1, 8), (1, 1, 8), (1, 8, 8), (1, 5, 6), (1, 5, 6)]
    call(one, 5, buffers)  # outside inference mode: checked again
    assert checked[-1] == (1, 5, 8) and len(checked) == 8


def test_another_model_config_does_not_load_a_precompiled_step(
    model_dirs, tmp_path, stored_target: Stored
) -> None:
    """The draft's config (one layer) in a store holding the target's steps of the same
    buffers (4 rows, the same context): its one-row one-token kind (one kind is enough:
    the fingerprint is the model's, the same for every kind) is not the target's, loaded,
    but compiled and saved beside it."""
    draft = load_fast(model_dirs["draft"], device="cpu", cpu_linear=False)
    for path in stored_target.store.glob("step-*.pt"):  # the target's 4 rows' steps
        shutil.copy(path, tmp_path)
    assert len(list(tmp_path.glob("step-*.pt"))) == 4
    other, _ = compiled_model(
        draft, 4, options=CompileOptions(store=tmp_path), share=WarmShare(kinds=frozenset({"1x1"}))
    )
    assert compiled_of(other) is not None and compiled_of(other).step.loaded == []  # type: ignore[union-attr]
    assert list(compiled_of(other).step.fns) == ["1x1"]  # type: ignore[union-attr]
    assert len(list(tmp_path.glob("step-*.pt"))) == 5


def test_a_step_is_compiled_for_its_batchs_slot_buffers(model_dirs, tmp_path) -> None:
    """The compiled step takes the slot buffers' sizes as constants (what halves a cold
    compile), so it is built for one batch shape: rows and pad. The store keeps a step per
    shape (a batch of other rows or another pad compiles its own, rather than loading one
    whose guards would refuse every call), and the cost probe times the batch's own
    buffers (a bucket past its rows at its rows), tracing nothing more."""
    from gateway.engine.batch.slots import slot_pad
    from gateway.speed.store import stored

    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    fast, _ = compiled_model(target, 3, options=CompileOptions(store=tmp_path))
    assert compiled_of(fast) is not None and compiled_of(fast).buffers == (
        3,
        target.context_length + slot_pad(),
    )
    assert stored(target, 3, False, tmp_path)
    assert not stored(target, 2, False, tmp_path)
    assert not stored(target, 3, False, tmp_path, prefill_chunk=256)
    traced = counters["stats"]["unique_graphs"]
    costs = Engine(fast).measure_costs(3)
    assert {rows for rows, _ in costs.means} == {1, 2, 4}  # bucket 4 timed at 3 rows
    assert counters["stats"]["unique_graphs"] == traced
    one = frozenset({"1x1"})
    other, _ = compiled_model(
        target, 2, options=CompileOptions(store=tmp_path), share=WarmShare(kinds=one)
    )
    assert compiled_of(other) is not None and compiled_of(other).step.loaded == []  # type: ignore[union-attr]
    again, _ = compiled_model(
        target, 3, options=CompileOptions(store=tmp_path), share=WarmShare(kinds=one)
    )
    assert compiled_of(again) is not None and compiled_of(again).step.loaded == ["1x1"]  # type: ignore[union-attr]
    assert len(list(tmp_path.glob("step-*.pt"))) == 5


def test_a_store_that_cannot_be_written_still_serves_the_compiled_step(
    model_dirs, tmp_path
) -> None:
    """The steps compiled ahead of time serve this start even where saving them fails (the
    next start compiles again); the log says which kinds were loaded, built, or jit."""
    target = load_fast(model_dirs["llama"], device="cpu", cpu_linear=False)
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    said: list[str] = []
    fast, _ = compiled_model(
        target, 4, options=CompileOptions(store=blocked / "store"), progress=said.append
    )
    step = compiled_of(fast).step  # type: ignore[union-attr]
    assert all(fn is not None for fn in step.fns.values()) and len(step.fns) == 4
    assert "loaded precompiled: none; compiled ahead of time: 1x1, 1xN, Bx1, BxN" in said[-1]


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
    range (engine/compiled.py `_layer`), so rows in slots out of order and with gaps are
    arranged, a filler row in each gap (batch/forward.py `contiguous_rows`). Each row's
    logits must be the eager forward's, in the caller's row order, and the gaps' slots must
    keep their committed keys."""
    from gateway.engine.batch.forward import Step, batched_forward
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
