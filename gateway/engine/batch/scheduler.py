"""Continuous batching: the requests of one target share every target forward.

`Batch.add` gives a prepared request (a LoopConfig, the same one a single request runs
on) a slot of the SlotCache; `Batch.step` advances every row by one step and returns each
row's events; a finished or cancelled row leaves its slot at once, and a new one can join
before the next step. One step:

1. Prefill: the oldest rows still prefilling feed their next chunks of prompt (at most
   `prefill_chunk` tokens a row; a row alone takes a rest of up to a quarter chunk with
   its last, within the budget; batch/chunks.py) in one forward of their own, at most
   `prefill_budget` tokens in all (rows x longest chunk), so a long arrival delays the
   others by one chunk per step, not by its whole prompt, arrivals that come together (as
   far along, within a chunk) prefill together, and the decoding rows wait at most one
   budget's forward a step.
2-4. Every decoding row plans its step exactly as alone (room and k: loop.plan_k; the
   proposal; grammar masks: loop.plan_masks): standard rows feed 1 token, speculative rows
   1 + n. Rows drafting with the same draft model draft together (batch/drafting.py: one
   draft forward per drafted position for all of them); model-free proposers (prompt
   lookup, prediction) propose row by row, at no forward cost.
5. ONE target forward over all planned rows (batch/forward.py: per-row positions and
   masks over the slots).
6-8. Every row settles as alone (loop.settle_step: verify, roll back, emit) and commits its
   cache length: every committed token but the last (rejected entries are left behind,
   never attended).
9. The k policy's c and the streamed deltas, per row.

Rows never see each other: a row's tokens depend on its own prompt, sampling parameters,
generator and grammar only, up to floating-point rounding of the shared forward (see
tests/unit/engine/test_batch.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

import torch

from gateway.engine.backends.base import slot_cache
from gateway.engine.batch.chunks import prefill_group
from gateway.engine.batch.costs import ForwardCosts
from gateway.engine.batch.drafting import DraftBatch
from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.batch.head_drafting import hand_features, step_tap
from gateway.engine.batch.kchoice import choose_batch_k, explore_offset
from gateway.engine.batch.prefix import PrefixCache
from gateway.engine.batch.rows import Event, Parked, Row, StepMark, failed
from gateway.engine.batch.slots import PREFILL_BUDGET, PREFILL_CHUNK, slot_pad
from gateway.engine.batch.tree_choice import TreeChoice, learned_for
from gateway.engine.batch.verify_step import verify_rows
from gateway.engine.loop import (
    NO_PROPOSAL,
    LoopConfig,
    StepPlan,
    _measure_c,
    finish_result,
    plan_k,
    plan_masks,
)
from gateway.engine.models import LoadedModel
from gateway.engine.proposers.base import Proposal, Proposer
from gateway.engine.proposers.draft_model import DraftModelProposer

__all__ = ["Batch", "Event", "Parked", "Row"]


class Batch:
    """Rows decoding on one target; `max_rows` slots of the target's context length."""

    def __init__(
        self,
        target: LoadedModel,
        max_rows: int,
        prefill_chunk: int = PREFILL_CHUNK,
        costs: dict[int, ForwardCosts] | None = None,
        prefill_budget: int = PREFILL_BUDGET,
    ):
        if max_rows < 1:
            raise ValueError(f"a batch needs at least one row, got {max_rows}")
        if prefill_chunk < 1:
            raise ValueError(f"a prefill chunk is at least one token, got {prefill_chunk}")
        self.target, self.max_rows, self.prefill_chunk = target, max_rows, prefill_chunk
        self.prefill_budget = max(prefill_chunk, prefill_budget)
        # The buffers' shape follows the chunk (a faster forward may be built for it).
        self.pad = slot_pad(prefill_chunk)
        self.cache = slot_cache(target.model, max_rows, target.context_length, pad=self.pad)
        self.prefixes = PrefixCache(self.cache)  # prompt prefixes kept in free slots
        self.rows: list[Row] = []
        self.drafts: dict[int, DraftBatch] = {}  # id(draft model) -> its shared draft slots
        self.trees = TreeChoice(learned_for(target.model))  # do trees pay (tree_choice.py)
        # Measured forward costs by id(model), shared with the engine (batch/costs.py): every
        # verify and draft forward here is observed; the k choice reads them.
        self.costs: dict[int, ForwardCosts] = {} if costs is None else costs
        self.forwards = 0
        self.steps = 0
        self.draft_forwards = 0  # shared draft forwards (each drafts for every row in it)
        self._forward_s = 0.0  # this step's forwards, target and draft (prefill included)
        self._last: StepMark | None = None  # the previous decoding step, for its overhead

    @property
    def free(self) -> int:
        return self.max_rows - len(self.rows)

    def add(self, cfg: LoopConfig, cancelled: Callable[[], bool] | None = None) -> Row:
        """Join at the next step; raises IndexError when every slot is taken."""
        if cfg.target is not self.target:
            raise ValueError("a batch decodes on one target model")
        slot, reused = self.prefixes.take(cfg.cache_scope, cfg.prompt_ids)
        row = Row(cfg, cancelled, slot, list(cfg.prompt_ids), prefilled=reused)
        cfg.stats.cached_prompt_tokens = reused
        self._seat(row, cfg.prompt_ids)
        return row

    def park(self, row: Row) -> Parked:
        """Take an unfinished row out of the batch between steps with its request's state
        and a copy of its committed keys and values; its slot serves another row at once,
        and `resume` puts it back bit for bit (serving/fairness.py: preemption of a tenant
        over its share of the rows). Its draft slot is left, its prefix kept; what is not
        lent back at `resume` is fed to the draft again (speed, never output)."""
        if row not in self.rows or row.finished:
            raise ValueError("only a row of this batch that has not finished can be parked")
        saved = self.cache.save(row.slot)
        self._vacate(row, keep=False)
        return Parked(row, saved)

    def resume(self, parked: Parked) -> Row:
        """A parked row back into a free slot; raises IndexError when every slot is taken."""
        row = parked.row
        if row.cfg.target is not self.target:
            raise ValueError("a parked row resumes on its own target")
        row.slot, _ = self.prefixes.take(None, ())
        self._seat(row, row.ctx, parked)
        return row

    def _seat(self, row: Row, prompt: Sequence[int], parked: Parked | None = None) -> None:
        """Row joins the rows in its slot (restored when parked) and, drafting with a draft
        model, a slot of its shared draft cache; a failure gives its slot back."""
        try:
            if parked is not None:
                self.cache.restore(row.slot, parked.saved)
            self._join_draft(row, prompt)
        except BaseException:
            self.cache.release(row.slot)
            raise
        self.rows.append(row)

    def _join_draft(self, row: Row, prompt: Sequence[int]) -> None:
        p = _shared(row.cfg.proposer)
        if p is None:
            return
        db = self.drafts.get(id(p.draft))
        if db is None:
            self._drop_idle_drafts()
            costs = self.costs.setdefault(id(p.draft), ForwardCosts())
            db = DraftBatch(p.draft, self.max_rows, self.pad, costs)
            self.drafts[id(p.draft)] = db
        db.join(p, row.cfg.cache_scope, prompt)

    def cancel(self, row: Row) -> None:
        """Drop a row now (no more events for it); its slot is free for the next arrival."""
        if row in self.rows:
            row.finished = True
            self._vacate(row)

    def _vacate(self, row: Row, keep: bool = True) -> None:
        """The row leaves: its slot goes back (a kept prefix when ``keep``); the row in the
        highest slot moves into it, so that the rows keep slots 0..n-1, which a faster
        forward may read as one view of the slot buffers (gateway/speed)."""
        self.rows.remove(row)
        freed = row.slot
        scope = row.cfg.cache_scope if keep else None
        tokens = row.ctx[: self.cache.length[freed]]
        last = max(self.rows, key=lambda r: r.slot, default=None)
        if last is not None and last.slot > freed:
            self.prefixes.leaving(freed, scope, tokens)  # the move overwrites it
            self.cache.move(last.slot, freed)
            scope, tokens = last.cfg.cache_scope, last.ctx[: self.cache.length[freed]]
            last.slot, freed = freed, last.slot  # the old slot keeps a copy of its prefix
        self.cache.release(freed)
        self.prefixes.keep(freed, scope, tokens)
        p = _shared(row.cfg.proposer)
        db = self.drafts.get(id(p.draft)) if p is not None else None
        if db is not None and p is not None:  # an idle draft keeps its cache for the next
            db.leave(p, row.cfg.cache_scope)  # request drafting with it (zeroing is slow)

    def _drop_idle_drafts(self) -> None:
        """Before another draft's cache is allocated, free those nobody drafts with."""
        for key in [k for k, db in self.drafts.items() if not db.members]:
            del self.drafts[key]

    def step(self, held: Collection[Row] = ()) -> list[tuple[Row, list[Event]]]:
        """One step of every row but those ``held`` (they sit this step out, keeping their
        slots: the serving layer's fair sharing, serving/fairness.py `StepPacer`); returns the
        events each row produced. A row's last event is its Finished (or the Exception its
        step raised); it has then left the batch. A held row whose request was cancelled
        ends now."""
        events: dict[int, list[Event]] = {id(r): [] for r in self.rows}
        started = time.perf_counter()
        self._observe_overhead(started)
        self._forward_s = 0.0
        sitting = {id(r) for r in held}
        stepping = [r for r in self.rows if id(r) not in sitting]
        for row in self.rows:
            if id(row) in sitting:
                events[id(row)] += self._end_if_cancelled(row)
        with torch.inference_mode():
            prefilled = self._prefill(stepping)
            ks: list[tuple[Row, int]] = []
            choose_batch_k(
                [r.cfg for r in stepping if not r.prefilling],
                self.costs.get(id(self.target)),
                {key: (db.draft, db.costs) for key, db in self.drafts.items()},
                explore_offset(self.steps),
            )  # 3a. one k for the batch's adaptive rows (now and then a neighbour)
            self.steps += 1
            for row in stepping:
                if row.prefilling:
                    events[id(row)] += self._end_if_cancelled(row)
                    continue
                try:
                    k = plan_k(row.cfg, row.ctx, row.cancelled)  # 2-3a
                except Exception as exc:  # this row's error must not end the others
                    events[id(row)].append(failed(row, exc))
                    continue
                if k is None:
                    events[id(row)] += self.finish(row)
                    continue
                if k == 0 and row.cfg.policy is not None and row.cfg.policy.batch_k == 0:
                    row.cfg.stats.paused_steps += 1
                ks.append((row, k))
            self.trees.choose([r for r, k in ks if k], len(ks))
            plans = self._plan(ks, events)  # 3b-4
            if plans:
                self._verify(plans, events)  # 5-9
        out = [(r, events[id(r)]) for r in self.rows if events[id(r)]]
        for row in [r for r in self.rows if r.finished]:
            self._vacate(row)
        self._last = None
        if plans and self.rows and not prefilled:  # the next step follows at once
            self._last = StepMark(started, len(plans), any(k for _, k in ks), self._forward_s)
        return out

    def _observe_overhead(self, now: float) -> None:
        """The previous decoding step's time outside its forwards, to the start of this one:
        its planning and settling, and whatever its caller did with its events (a gateway's
        worker hands them to the event loop and waits for the interpreter lock, and steps
        the batches of its other targets, if it serves several). Steps that
        prefilled are left out: that is a prompt's cost, not a decoding step's."""
        last = self._last
        if last is None:
            return
        outside = now - last.started - last.forward_s
        self.target_costs().observe_overhead(last.rows, last.drafted, outside)

    def target_costs(self) -> ForwardCosts:
        return self.costs.setdefault(id(self.target), ForwardCosts())

    # -- the steps ------------------------------------------------------------------------

    def _prefill(self, stepping: list[Row]) -> bool:
        """1. The oldest prefilling rows feed their next chunks in one forward, the rows
        and chunks batch/chunks.py `prefill_group` picks (within `prefill_chunk` tokens a
        row and `prefill_budget` in all). Returns whether anything was prefilled."""
        waiting = [r for r in stepping if r.prefilling and not r.finished]
        if not waiting:
            return False
        group = prefill_group(waiting, self.prefill_chunk, self.prefill_budget)
        t0 = time.perf_counter()
        slots, chunks = [r.slot for r, _ in group], [c for _, c in group]
        tap = step_tap(r.cfg for r, _ in group)  # hidden states for head rows
        step = Step(self.cache, slots, chunks, keep_last=True, tap=tap, prompt=True)
        batched_forward(self.target.model, step, self.target.fast)
        self.forwards += 1
        drafts: dict[int, list[tuple[DraftModelProposer, list[int]]]] = {}
        for i, (row, chunk) in enumerate(group):
            hand_features(row.cfg, tap, i, row.prefilled, len(chunk))
            self.cache.length[row.slot] = row.prefilled + len(chunk)
            p = _shared(row.cfg.proposer)
            if p is not None and id(p.draft) in self.drafts and p.fed == row.prefilled:
                drafts.setdefault(id(p.draft), []).append((p, chunk))  # beside the target's
            row.prefilled += len(chunk)
            row.forwards += 1
        for key, items in drafts.items():
            self.drafts[key].prefill(items)
        spent = time.perf_counter() - t0
        self._forward_s += spent
        for row, _ in group:
            row.cfg.stats.prefill_s += spent
        return True

    def _plan(
        self, ks: list[tuple[Row, int]], events: dict[int, list[Event]]
    ) -> list[tuple[Row, StepPlan]]:
        """3b-4: every row's proposal (draft-model rows together, per draft), then its
        grammar masks."""
        proposals: dict[int, Proposal] = {}
        shared: dict[int, list[Row]] = {}
        for row, k in ks:
            p = row.cfg.proposer
            if k == 0 or p is None:
                continue
            d = p.shared_draft()
            if d is not None and id(d.draft) in self.drafts:
                shared.setdefault(id(d.draft), []).append(row)
                continue
            t0 = time.perf_counter()
            try:
                proposals[id(row)] = p.propose(row.ctx, k)
            except Exception as exc:
                events[id(row)].append(failed(row, exc))
            row.times.draft_s += time.perf_counter() - t0
        k_of = {id(row): k for row, k in ks}
        for key, rows in shared.items():
            t0 = time.perf_counter()
            asks = [(row.cfg.proposer, row.ctx, k_of[id(row)]) for row in rows]
            db = self.drafts[key]
            before, forward_s = db.forwards, db.forward_s
            try:
                got = db.propose(asks)  # type: ignore[arg-type]
            except Exception as exc:  # a failed shared draft ends the rows that drafted
                for row in rows:
                    events[id(row)].append(failed(row, exc))
                continue
            spent = time.perf_counter() - t0
            self.draft_forwards += db.forwards - before
            self._forward_s += db.forward_s - forward_s
            for row, proposal in zip(rows, got, strict=True):
                row.times.draft_s += spent
                if isinstance(proposal, Exception):
                    events[id(row)].append(failed(row, proposal))
                else:
                    proposals[id(row)] = proposal
        plans: list[tuple[Row, StepPlan]] = []
        for row, k in ks:
            if row.finished:
                continue
            try:
                plan = plan_masks(row.cfg, k, proposals.get(id(row), NO_PROPOSAL), row.times)
            except Exception as exc:
                events[id(row)].append(failed(row, exc))
                continue
            plans.append((row, plan))
        return plans

    def _verify(self, plans: list[tuple[Row, StepPlan]], events: dict[int, list[Event]]) -> None:
        self._forward_s += verify_rows(self, plans, events)  # 5-9 (batch/verify_step.py)

    def _end_if_cancelled(self, row: Row) -> list[Event]:
        """A row not stepping now (held, or prefilling) whose request was cancelled ends
        here; its events (none if it goes on)."""
        if row.cancelled is None or not row.cancelled():
            return []
        row.cfg.output.finish("cancelled")
        return self.finish(row)

    def finish(self, row: Row) -> list[Event]:
        out: list[Event] = []
        final = row.cfg.output.delta()
        if final is not None:
            out.append(final)
        c = _measure_c(row.cfg, row)  # type: ignore[arg-type]
        out.append(finish_result(row.cfg, row.times, row.t_start, row.forwards, c))
        row.finished = True
        return out


def _shared(p: Proposer | None) -> DraftModelProposer | None:
    """The proposer as the batch drafts for it in its draft model's shared forwards, or None
    (none, or one the batch asks to `propose`)."""
    return None if p is None else p.shared_draft()
