"""A compiled forward for the batch path: torch.compile (inductor) over the model's own
forward, with the slot cache of batch/slots.py.

Why: at the demo sizes an eager step spends most of its time in Python and dispatch, about
a millisecond per layer; inductor fuses the norms, rotary embeddings and activations and
runs the layer as a few generated kernels.

Shapes. A batch step is (rows, tokens) over a key span that grows by a token a step. The
model is compiled with dynamic shapes, so one graph covers every row count, token count and
span of one kind of step; the kinds are one row feeding one token (no mask, slice writes
into the slot), one row feeding several, and several rows (index writes, a mask), so a
handful of graphs cover every step. `warm_up` compiles them at start, before the gateway
says it is ready, and inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR) makes a restart
quick.

Exactness: the compiled kernels compute the same math in another order, so logits may
differ in the last bits; greedy outputs are compared token for token with eager ones in
tests/unit/engine/test_compiled.py, and `python -m benchmarks engine_compiled` counts
partings on the held-out prompts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from gateway.engine.models import LoadedModel

log = logging.getLogger("gateway.engine.compiled")


@dataclass(frozen=True)
class CompiledForwards:
    """The model's forward and its backbone's (no output head: drafting with a reduced
    head, draft prefill), each compiled once."""

    full: Callable[..., Any]
    backbone: Callable[..., Any]


def compile_forwards(model: Any) -> CompiledForwards:
    """Compile lazily: nothing is traced until the first call (`warm_up` makes it)."""
    return CompiledForwards(
        full=torch.compile(model, dynamic=True),
        backbone=torch.compile(model.base_model, dynamic=True),
    )


def compiled_model(
    lm: LoadedModel, max_rows: int, draft: bool = False,
    progress: Callable[[str], None] = log.info,
) -> tuple[LoadedModel, float]:  # fmt: skip
    """``lm`` with compiled forwards, every kind of batch step already compiled on a slot
    cache of the batch's own shapes (so serving compiles nothing more); and the seconds the
    warm-up took. A draft warms its backbone too: draft prefill and reduced-head drafting
    run through it."""
    out = replace(lm, compiled=compile_forwards(lm.model))
    return out, warm_up(out, max_rows, draft, progress)


def warm_up(
    lm: LoadedModel, max_rows: int, draft: bool = False,
    progress: Callable[[str], None] = log.info,
) -> float:  # fmt: skip
    """Trace and compile every kind of batch step (one row x one token, one row x several,
    several rows x one, several x several) on a scratch cache shaped like a batch's; returns
    the seconds spent."""
    from gateway.engine.batch.forward import batched_forward
    from gateway.engine.batch.slots import SlotCache, slot_pad
    from gateway.engine.models import cache_kwarg

    assert lm.compiled is not None
    model = lm.model
    kwarg = cache_kwarg(model)
    layers = int(model.config.num_hidden_layers)
    cache = SlotCache(layers, max_rows, lm.context_length, pad=slot_pad())
    heads = (False, True) if draft else (False,)
    row_counts = (1, 2) if max_rows > 1 else (1,)
    kinds = [(rows, t, bb) for bb in heads for rows in row_counts for t in (1, 2, 5)]
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i, (rows, t, bb) in enumerate(kinds, 1):
            slots = list(range(rows))
            for s in slots:
                cache.length[s] = 3 + s  # rows of different lengths, as in a real batch
            batched_forward(
                model, kwarg, cache, slots, [[1] * t] * rows, lm.device,
                backbone=bb, compiled=lm.compiled,
            )  # fmt: skip
            progress(
                f"compiling {lm.path}: step kind {i}/{len(kinds)} ({rows} row(s) x {t} "
                f"token(s){', backbone' if bb else ''}), {time.perf_counter() - t0:.1f} s"
            )
    return time.perf_counter() - t0
