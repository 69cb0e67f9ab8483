"""Continuous batching: the requests of one target share every target forward.

`Batch.add` gives a prepared request (a LoopConfig, the same one a single request runs
on) a slot of the SlotCache; `Batch.step` advances every row by one step and returns each
row's events; a finished or cancelled row leaves its slot at once, and a new one can join
before the next step. One step:

1. Prefill: the oldest row still prefilling feeds one chunk (at most `prefill_chunk`
   tokens) of its prompt in a forward of its own, so a long arrival delays the others by
   one chunk per step, not by its whole prompt.
2-4. Every decoding row plans its step exactly as alone (loop.plan_step: room, k, the
   proposer's draft, grammar masks): standard rows feed 1 token, speculative rows 1 + n.
5. ONE target forward over all planned rows (batch/forward.py: per-row positions and
   masks over the slots).
6-8. Every row settles as alone (loop.settle_step: verify, roll back, emit) and commits its
   cache length: every committed token but the last (rejected entries are left behind,
   never attended).
9. The k policy's c and the streamed deltas, per row.

Rows never see each other: a row's tokens depend on its own prompt, sampling parameters,
generator and grammar only, up to floating-point rounding of the shared forward (see
tests/unit/engine/test_batch.py). Draft models still draft row by row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gateway.engine.batch.forward import batched_forward
from gateway.engine.batch.slots import SlotCache
from gateway.engine.loop import (
    LoopConfig,
    RowTimes,
    StepPlan,
    _measure_c,
    finish_result,
    plan_step,
    settle_step,
)
from gateway.engine.models import LoadedModel, cache_kwarg
from gateway.engine.schema import Delta, Finished

PREFILL_CHUNK = 128
Event = Delta | Finished | Exception  # an Exception ends its row: the consumer raises it


@dataclass
class Row:
    """One request inside a batch."""

    cfg: LoopConfig
    cancelled: Callable[[], bool] | None
    slot: int
    ctx: list[int]
    t_start: float = field(default_factory=time.perf_counter)
    times: RowTimes = field(default_factory=RowTimes)
    prefilled: int = 0  # prompt tokens already in the slot (all but the last get there)
    forwards: int = 0
    decode_forwards: int = 0  # read by loop._measure_c, like TargetRunner's
    decode_forward_s: float = 0.0
    finished: bool = False

    @property
    def prefilling(self) -> bool:
        """Prompt tokens (all but the last) not yet in the slot."""
        return self.prefilled < len(self.cfg.prompt_ids) - 1


class Batch:
    """Rows decoding on one target; `max_rows` slots of the target's context length."""

    def __init__(self, target: LoadedModel, max_rows: int, prefill_chunk: int = PREFILL_CHUNK):
        if max_rows < 1:
            raise ValueError(f"a batch needs at least one row, got {max_rows}")
        self.target = target
        self.max_rows = max_rows
        self.prefill_chunk = prefill_chunk
        layers = int(target.model.config.num_hidden_layers)
        self.cache = SlotCache(layers, max_rows, target.context_length)
        self._kwarg = cache_kwarg(target.model)
        self.rows: list[Row] = []
        self.forwards = 0

    @property
    def free(self) -> int:
        return self.max_rows - len(self.rows)

    def add(self, cfg: LoopConfig, cancelled: Callable[[], bool] | None = None) -> Row:
        """Join at the next step; raises IndexError when every slot is taken."""
        if cfg.target is not self.target:
            raise ValueError("a batch decodes on one target model")
        row = Row(cfg, cancelled, self.cache.take(), list(cfg.prompt_ids))
        self.rows.append(row)
        return row

    def cancel(self, row: Row) -> None:
        """Drop a row now (no more events for it); its slot is free for the next arrival."""
        if row in self.rows:
            self.rows.remove(row)
            self.cache.release(row.slot)
            row.finished = True

    def step(self) -> list[tuple[Row, list[Event]]]:
        """One step of every row; returns the events each row produced. A row's last event
        is its Finished (or the Exception its step raised); it has then left the batch."""
        events: dict[int, list[Event]] = {id(r): [] for r in self.rows}
        with torch.inference_mode():
            self._prefill()
            plans: list[tuple[Row, StepPlan]] = []
            for row in self.rows:
                if row.prefilling:
                    if row.cancelled is not None and row.cancelled():
                        row.cfg.output.finish("cancelled")
                        events[id(row)] += self._finish(row)
                    continue
                try:
                    plan = plan_step(row.cfg, row.ctx, row.cancelled, row.times)  # 2-4
                except Exception as exc:  # this row's error must not end the others
                    events[id(row)].append(_failed(row, exc))
                    continue
                if plan is None:
                    events[id(row)] += self._finish(row)
                else:
                    plans.append((row, plan))
            if plans:
                self._verify(plans, events)  # 5-9
        out = [(r, events[id(r)]) for r in self.rows if events[id(r)]]
        for row in [r for r in self.rows if r.finished]:
            self.rows.remove(row)
            self.cache.release(row.slot)
        return out

    # -- the steps ------------------------------------------------------------------------

    def _prefill(self) -> None:
        row = next((r for r in self.rows if r.prefilling and not r.finished), None)
        if row is None:
            return
        t0 = time.perf_counter()
        end = min(len(row.cfg.prompt_ids) - 1, row.prefilled + self.prefill_chunk)
        chunk = row.ctx[row.prefilled : end]
        batched_forward(
            self.target.model, self._kwarg, self.cache, [row.slot], [chunk],
            self.target.device, keep_last=True,
        )  # fmt: skip
        self.cache.length[row.slot] = end
        row.prefilled = end
        row.forwards += 1
        self.forwards += 1
        row.cfg.stats.prefill_s += time.perf_counter() - t0

    def _verify(self, plans: list[tuple[Row, StepPlan]], events: dict[int, list[Event]]) -> None:
        t0 = time.perf_counter()
        feeds = [[row.ctx[-1], *plan.draft] for row, plan in plans]
        slots = [row.slot for row, _ in plans]
        logits = batched_forward(
            self.target.model, self._kwarg, self.cache, slots, feeds, self.target.device
        )  # [(n_r + 1, V)]
        spent = time.perf_counter() - t0
        self.forwards += 1
        for (row, plan), z in zip(plans, logits, strict=True):
            row.forwards += 1
            row.decode_forwards += 1
            row.decode_forward_s += spent
            row.times.verify_s += spent
            cfg = row.cfg
            before = len(row.ctx)
            try:
                m = settle_step(cfg, row.ctx, plan, z, row.times)  # 6-8
            except Exception as exc:
                events[id(row)].append(_failed(row, exc))
                continue
            self.cache.length[row.slot] = before + m  # 7. every committed token but the last
            if cfg.policy is not None and cfg.proposer is not None:  # 9.
                cfg.policy.observe_c(_measure_c(cfg, row))  # type: ignore[arg-type]
            delta = cfg.output.delta()
            if delta is not None:
                events[id(row)].append(delta)
            if cfg.output.finish_reason is not None:
                events[id(row)] += self._finish(row)

    def _finish(self, row: Row) -> list[Event]:
        out: list[Event] = []
        final = row.cfg.output.delta()
        if final is not None:
            out.append(final)
        c = _measure_c(row.cfg, row)  # type: ignore[arg-type]
        out.append(finish_result(row.cfg, row.times, row.t_start, row.forwards, c))
        row.finished = True
        return out


def _failed(row: Row, exc: Exception) -> Exception:
    row.finished = True
    return exc
