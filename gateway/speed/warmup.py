"""A model's compiled step made ready at start: compiled (or loaded from the store) for
every kind of step a batch runs, and with GATEWAY_COMPILE=auto kept only for the kinds
that measured faster than eager."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.batch.slots import PREFILL_CHUNK, SlotCache
from gateway.engine.models import LoadedModel
from gateway.speed.compiled import CompiledForwards, compile_forwards
from gateway.speed.fast import Accelerated, compiled_of, lean_of
from gateway.speed.kinds import FASTER, MAX_TOKENS, kind, warm_kinds
from gateway.speed.store import Precompiled, batch_buffers

log = logging.getLogger("gateway.speed.warmup")


@dataclass(frozen=True)
class CompileOptions:
    """How a model's step is compiled and made ready (the model pool's compile settings).

    `inductor` False keeps the eager lean step (nothing to compile; with `graphs`, inside
    the captured graphs). `graphs`: the step is padded to buckets and, on CUDA, replayed as
    captured graphs (graphs.py; recorded per cache on first use of a bucket). `store` (a
    folder): each kind is compiled ahead of time and saved there, or loaded from there
    when an earlier start saved it (`Precompiled`). `measure` (GATEWAY_COMPILE=auto): each
    kind is timed compiled and eager, and only the kinds where compiling measured faster
    are served compiled. `prefill_chunk`: the batch's (GATEWAY_PREFILL_CHUNK): the step
    is compiled for the slot buffers such a batch allocates (`batch_buffers`)."""

    inductor: bool = True
    graphs: bool = False
    store: Path | None = None
    measure: bool = False
    prefill_chunk: int = PREFILL_CHUNK


def compiled_model(
    lm: LoadedModel, max_rows: int, draft: bool = False,
    options: CompileOptions = CompileOptions(), progress: Callable[[str], None] = log.info,
    kinds: frozenset[str] | None = None,
) -> tuple[LoadedModel, float]:  # fmt: skip
    """``lm`` with its compiled step (a draft's: drafting, through its reduced head if it
    has one; a target's: verify), every kind of step already compiled on a slot cache
    of the batch's own shapes (so serving compiles nothing more), as `options` say
    (`CompileOptions`); and the seconds the warm-up took. With `options.measure`, where
    no kind measured faster, ``lm`` comes back eager. Raises ValueError for a model
    without a lean decoder (its family was not checked, speed/lean.py): it runs eager.
    `kinds`: warm up only these kinds of step (`warm_up`)."""
    lean = lean_of(lm)
    if lean is None:
        raise ValueError("only models the lean decoder runs are compiled (Llama, Mistral, Qwen2)")
    fast = compile_forwards(
        lean, keep_last=draft, head=lm.draft_head if draft else None,
        inductor=options.inductor, graph_rows=max(2, max_rows) if options.graphs else 0,
        store=options.store,
    )  # fmt: skip
    buffers = batch_buffers(lm, max_rows, options.prefill_chunk)
    out = with_compiled(lm, replace(fast, buffers=buffers))
    t0 = time.perf_counter()
    if options.inductor:
        warm_up(out, max_rows, progress, kinds)
        step = fast.step if fast.graphs is None else fast.graphs.step
        if isinstance(step, Precompiled):

            def named(kinds: list[str]) -> str:
                return ", ".join(sorted(kinds)) or "none"

            built = [k for k, f in step.fns.items() if f is not None and k not in step.loaded]
            jit = [k for k, f in step.fns.items() if f is None]
            progress(
                f"{lm.path}: step kinds loaded precompiled: {named(step.loaded)}; compiled "
                f"ahead of time: {named(built)}; just in time: {named(jit)} "
                f"({step.store})"
            )
    if options.measure:
        ratios = measure_kinds(out, max_rows)
        faster = faster_kinds(ratios)
        progress(
            f"{lm.path}: compiled/eager time by step kind "
            + ", ".join(f"{k} {r:.2f}" for k, r in sorted(ratios.items()))
            + f"; compiled for {', '.join(sorted(faster)) or 'none: eager'}"
        )
        done = compiled_of(out)
        assert done is not None
        out = with_compiled(out, replace(done, kinds=faster) if faster else None)
    return out, time.perf_counter() - t0


def faster_kinds(ratios: dict[str, float]) -> frozenset[str]:
    """The kinds whose compiled/eager time ratio is at most FASTER."""
    return frozenset(k for k, r in ratios.items() if r <= FASTER)


def measure_kinds(lm: LoadedModel, max_rows: int, repeats: int = 7) -> dict[str, float]:
    """Compiled/eager time (median of `repeats`) of each kind of step this model's compiled
    step serves, on a scratch cache of the batch's shapes with 128 cached tokens a row:
    one row x 1 token, one row x 3 tokens, and with two rows or more all rows x 1 and all
    rows x 3."""
    from gateway.engine.batch.costs import sync

    fast = compiled_of(lm)
    assert fast is not None
    plain = Accelerated(lean_of(lm))  # the same model without its compiled step
    rows = max_rows
    context = max(1, min(128, lm.context_length - 2 * MAX_TOKENS))
    fill = [[1 + (3 * r + j) % (lm.vocab_size - 1) for j in range(context)] for r in range(rows)]
    shapes = {"1x1": (1, 1), "1xN": (1, 3), "Bx1": (rows, 1), "BxN": (rows, 3)}
    shapes = {n: (b, t) for n, (b, t) in shapes.items() if n in fast.kinds and kind(b, t) == n}
    ratios: dict[str, float] = {}
    with torch.inference_mode():
        cache, slots = _scratch(lm, fill)
        for name, (b, t) in shapes.items():
            feed = [[2] * t] * b
            spent: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(repeats + 1):
                for compiled in (False, True):  # alternating, so load drifts hit both
                    for s in slots:
                        cache.length[s] = context
                    t0 = time.perf_counter()
                    step = Step(cache, slots[:b], feed, keep_last=fast.keep_last, head=fast.head)
                    batched_forward(lm.model, step, lm.fast if compiled else plain)
                    sync(lm.device)
                    spent[compiled].append(time.perf_counter() - t0)
            eager, comp = (sorted(spent[c][1:])[repeats // 2] for c in (False, True))
            ratios[name] = comp / eager if eager > 0 else 1.0
    return ratios


def warm_up(
    lm: LoadedModel,
    max_rows: int,
    progress: Callable[[str], None] = log.info,
    kinds: frozenset[str] | None = None,
) -> float:
    """Trace and compile every kind of step a batch of `max_rows` rows runs (one row x one
    token, one row x several tokens, and with two rows or more several rows x one and
    several x several; `kinds`: only these) on a scratch cache shaped like the batch's;
    returns the seconds spent."""
    fast = compiled_of(lm)
    assert fast is not None
    order = [k for k in warm_kinds(max_rows) if kinds is None or kind(*k) in kinds]
    t0 = time.perf_counter()
    fill = [[1, 2, 3], [1, 2, 3, 4]][:max_rows]  # rows of different lengths, as in a batch
    with torch.inference_mode():
        cache, slots = _scratch(lm, fill)
        for done, (rows, t) in enumerate(order, 1):
            for s, f in zip(slots, fill, strict=True):
                cache.length[s] = len(f)
            step = Step(cache, slots[:rows], [[1] * t] * rows, fast.keep_last, head=fast.head)
            batched_forward(lm.model, step, lm.fast)
            progress(
                f"compiling {lm.path}: step kind {done}/{len(order)} ({rows} row(s) x {t} "
                f"token(s)), {time.perf_counter() - t0:.1f} s"
            )
    return time.perf_counter() - t0


def _scratch(lm: LoadedModel, fill: list[list[int]]) -> tuple[SlotCache, list[int]]:
    """A slot cache of the buffers the compiled step was built for (`CompiledForwards.
    buffers`: a batch's, whose sizes the step takes as constants), one slot per row of
    `fill` holding that row's tokens (prefilled eager, uncommitted: callers set the
    lengths they want)."""
    fast = compiled_of(lm)
    assert fast is not None
    cache = fast.slot_cache(int(lm.model.config.num_hidden_layers), lm.context_length)
    slots = [cache.take() for _ in fill]
    batched_forward(lm.model, Step(cache, slots, fill, keep_last=True), Accelerated(lean_of(lm)))
    return cache, slots


def with_compiled(lm: LoadedModel, compiled: CompiledForwards | None) -> LoadedModel:
    """`lm` with `compiled` as its compiled forwards (None: its lean decoder alone)."""
    lean = lean_of(lm)
    fast = None if lean is None and compiled is None else Accelerated(lean, compiled)
    return replace(lm, fast=fast)
