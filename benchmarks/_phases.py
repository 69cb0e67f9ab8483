"""Where a batch step's wall time goes: exclusive seconds per phase, for step_profile.py.

`install()` wraps the functions a step runs through (class methods and the names the
scheduler and drafting modules imported) with a perf_counter pair each; a phase's time
excludes the phases nested in it, so the phases add up to the time spent inside
`Batch.step`. Model compute (the lean decoder's or the compiled step's tensor work) is
`target_compute` or `draft_compute` by whether a draft phase encloses it; a reduced draft
head's product is `draft_head` (compute too; checkouts before it had a method of its own
count it in `draft_propose`). Everything that is not compute is overhead: what issue 20
asks to keep under 10% of a step.

The wrappers cost about a microsecond each (a few dozen calls a step); the benchmark
reports that cost beside the phases. In a gateway process, `python -m
benchmarks._phases` installs them and runs the gateway; SIGUSR1 writes the totals so far
to $GATEWAY_PHASES_OUT (JSON), so a benchmark can difference two snapshots around its
measured window.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

TOTALS: dict[str, float] = {}
CALLS: dict[str, int] = {}
_stack: list[list[Any]] = []  # [phase, child seconds]
_installed = False

COMPUTE = "compute"


def _wrap(phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        name = phase
        if phase == COMPUTE:
            drafting = any(f[0] in ("draft_propose", "draft_prefill") for f in _stack)
            name = "draft_compute" if drafting else "target_compute"
        frame = [name, 0.0]
        _stack.append(frame)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - t0
            _stack.pop()
            TOTALS[name] = TOTALS.get(name, 0.0) + spent - frame[1]
            CALLS[name] = CALLS.get(name, 0) + 1
            if _stack:
                _stack[-1][1] += spent

    return timed


def install() -> None:
    """Wrap the step's functions (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    for owner, attr, phase in targets():
        setattr(owner, attr, _wrap(phase, getattr(owner, attr)))


def targets() -> list[tuple[Any, str, str]]:
    """(class or module, attribute, phase) for each function `install` wraps that this
    checkout has (an older one, step_profile's "before", may lack some). A module's entry is
    the name its callers look up: the scheduler's and drafting's own imports."""
    from gateway.engine import draft_head
    from gateway.engine.batch import drafting, scheduler
    from gateway.serving import worker
    from gateway.speed import steps
    from gateway.speed.compiled import CompiledForwards
    from gateway.speed.lean import LeanDecoder

    wanted = [
        (worker.InferenceWorker, "_admit", "worker_admit"),
        (worker.Job, "emit", "worker_emit"),
        (getattr(worker, "Outbox", getattr(worker, "_Outbox", None)), "flush", "worker_emit"),
        (scheduler.Batch, "step", "step_other"),
        (scheduler.Batch, "_prefill", "prefill_other"),
        (scheduler.Batch, "_finish", "finish"),
        (drafting.DraftBatch, "propose", "draft_propose"),
        (drafting.DraftBatch, "prefill", "draft_prefill"),
        (drafting.DraftBatch, "_head", "draft_head"),  # a reduced head (checkouts before e54d91a)
        (draft_head.DraftHead, "__call__", "draft_head"),  # a reduced head, eager (compiled
        # steps call its forward inside their graph: compute)
        (LeanDecoder, "__call__", COMPUTE),
        (CompiledForwards, "__call__", COMPUTE),
        (scheduler, "batched_forward", "forward_prep"),
        (drafting, "batched_forward", "forward_prep"),
        (scheduler, "plan_k", "plan_k"),
        (scheduler, "choose_batch_k", "choose_k"),
        (scheduler, "plan_masks", "plan_masks"),
        (scheduler, "settle_step", "settle"),
        # a compiled several-token step leaves the target's output head to its caller
        # (speed/steps.py): that product is compute, not the forward's preparation
        (steps, "_outer_head", COMPUTE),
    ]
    return [(o, a, p) for o, a, p in wanted if o is not None and hasattr(o, a)]


def snapshot() -> dict[str, Any]:
    return {"seconds": dict(TOTALS), "calls": dict(CALLS)}


def difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {
        part: {k: v - before[part].get(k, 0) for k, v in after[part].items()}
        for part in ("seconds", "calls")
    }


def wrapper_cost(n: int = 200_000) -> float:
    """Seconds one wrapped call adds (a wrapped no-op against the bare no-op)."""

    def noop() -> None:
        return None

    wrapped = _wrap("wrapper_cost_probe", noop)
    t0 = time.perf_counter()
    for _ in range(n):
        noop()
    bare = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n):
        wrapped()
    cost = (time.perf_counter() - t0 - bare) / n
    TOTALS.pop("wrapper_cost_probe", None)
    CALLS.pop("wrapper_cost_probe", None)
    return cost


def _dump(signum: int, frame: Any) -> None:
    path = os.environ["GATEWAY_PHASES_OUT"]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(snapshot(), f)
    os.replace(tmp, path)


if __name__ == "__main__":
    install()
    signal.signal(signal.SIGUSR1, _dump)
    from gateway.__main__ import main

    main()
