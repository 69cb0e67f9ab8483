"""Compiled steps kept in a store between starts (speed/store.py `Precompiled`): saved,
then loaded without tracing; a call a stored step's guards refuse runs just in time; a
store of another model config, batch shape or an unwritable folder; and the prefill
chunks and one-position key spans a stored step serves or leaves to eager.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from gateway.engine import DecodeRequest, Engine, LoadedModel
from gateway.engine.batch.forward import Step, batched_forward
from gateway.speed import cpu_linear, load_fast
from gateway.speed.fast import Accelerated, compiled_of, lean_of
from gateway.speed.warmup import CompileOptions, compiled_model
from tests.support.batch import Job, drive, greedy, mixed_jobs, run_batch

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
        draft, 4, options=CompileOptions(store=tmp_path), kinds=frozenset({"1x1"})
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
    other, _ = compiled_model(target, 2, options=CompileOptions(store=tmp_path), kinds=one)
    assert compiled_of(other) is not None and compiled_of(other).step.loaded == []  # type: ignore[union-attr]
    again, _ = compiled_model(target, 3, options=CompileOptions(store=tmp_path), kinds=one)
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
