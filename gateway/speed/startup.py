"""The compile helper planned at a start (precompile.py runs it): which models' steps a
helper process compiles beside the gateway, and which kinds of the first target it
shares."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from gateway.engine.models import LoadedModel
from gateway.speed import precompile
from gateway.speed.store import stored

HELPER_TIMEOUT = 1800.0  # seconds a compile helper may take before it is killed
SHARED = ("BxN",)
"""The first target's kinds the helper compiles too: several rows x several tokens, the
costliest after the first kind. Where the helper's share comes out longer, the gateway
takes its last kinds (precompile.Helper.take_last)."""


def plan_helper(
    models: list[tuple[LoadedModel, bool]],
    store: Path,
    compile_rows: Callable[[int], int],
    prefill_chunk: int,
) -> precompile.Helper | None:
    """A helper compiling `models` (every target, each followed by its drafts, as
    (model, is a draft)) but the first target's own kinds into `store`, started; None when
    it would not overlap anything: one core, a model off the CPU, or the first target's
    steps all stored already (a restart only loads them)."""
    if (os.cpu_count() or 1) < 2 or any(m.device.type != "cpu" for m, _ in models):
        return None
    jobs: list[precompile.Job] = []
    mine: list[LoadedModel | None] = []  # a job whose kinds this process may take
    rows, busy = 0, False  # busy: the first target has steps to compile here
    for i, (model, draft) in enumerate(models):
        if not draft:  # a draft is compiled for its target's rows
            rows = compile_rows(model.context_length)
        if stored(model, rows, draft, store, prefill_chunk=prefill_chunk):
            continue
        if i == 0:
            busy = True
            shared = frozenset(SHARED)
            if rows >= 2 and not stored(model, rows, draft, store, shared, prefill_chunk):
                jobs.append(precompile.Job.of(model, rows, draft, prefill_chunk, SHARED))
                mine.append(None)  # the kinds this process waits for: never taken
        else:
            jobs.append(precompile.Job.of(model, rows, draft, prefill_chunk))
            mine.append(model)
    return precompile.start(jobs, store, models=mine) if busy and jobs else None
