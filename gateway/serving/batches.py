"""The continuous batch of each target engine on the inference thread, which job each row
belongs to (serving/worker.py steps them every round), and the rows a tenant over its
share gives up to an arriving one (preemption: serving/fairness.py)."""

from __future__ import annotations

import time

from gateway.engine import PREFILL_BUDGET, PREFILL_CHUNK, Batch, Engine, Event, Row
from gateway.serving.fairness import Share, StepPacer, default_max_rows
from gateway.serving.jobs import Decode, Job


class Batches:
    """The continuous batch of each target engine, and which job each row belongs to."""

    def __init__(
        self, max_rows: int, kv_budget_tokens: int | None = None,
        prefill_chunk: int = PREFILL_CHUNK, prefill_budget: int = PREFILL_BUDGET,
    ) -> None:  # fmt: skip
        self.max_rows = max_rows
        self.kv_budget_tokens = kv_budget_tokens
        self.prefill_chunk = prefill_chunk
        self.prefill_budget = prefill_budget
        self._batches: dict[int, Batch] = {}  # id(engine) -> engine.batch(max_rows)
        self._jobs: dict[int, Job] = {}  # id(row) -> its job
        self._parked: dict[int, int] = {}  # id(engine) -> its batch's rows parked now

    @property
    def rows(self) -> int:
        return len(self._jobs)

    def rows_of(self, job: Job) -> int:
        """Rows of the batch the job would join (what its tenant's default row cap is
        taken from)."""
        if job.decode is None:
            return self.max_rows
        ctx = job.decode.engine.context_length
        return batch_rows(self.max_rows, self.kv_budget_tokens, ctx)

    def has_room(self, engine: Engine) -> bool:
        batch = self._batches.get(id(engine))
        return batch is None or batch.free > 0

    def add(self, job: Job) -> int:
        """The job's row joins its engine's batch (a parked job's row resumes); returns the
        prompt tokens it will prefill (those a kept prefix does not already hold)."""
        d = job.decode
        assert d is not None
        batch = self._batches.get(id(d.engine))
        if batch is None:
            rows = self.rows_of(job)
            batch = d.engine.batch(rows, self.prefill_chunk, self.prefill_budget)
            self._batches[id(d.engine)] = batch
        if job.parked is not None:
            parked, job.parked = job.parked, None
            self.unpark(d)
            row = batch.resume(parked)
            self._jobs[id(row)] = job
            return 0
        row = batch.add(d.engine.prepare(d.request, d.draft), job.cancelled.is_set)
        self._jobs[id(row)] = job
        return len(row.cfg.prompt_ids) - row.prefilled

    def preemptible(self, job: Job) -> Row | None:
        """The row to park so that ``job`` takes its slot now, or None: its batch is full,
        its tenant holds fewer rows than its weighted share of the batch (the batch's rows
        x its weight over the weights of the tenants holding rows and its own) and another
        tenant holds more than its own share; that tenant's newest row (the one furthest
        past its share first). Parked rows of a batch are at most as many as its rows, so
        their keys and values are at most one more batch's worth."""
        d = job.decode
        batch = None if d is None else self._batches.get(id(d.engine))
        if d is None or batch is None or batch.free > 0 or not batch.cache.parkable:
            return None
        if self._parked.get(id(d.engine), 0) >= batch.max_rows:
            return None
        held: dict[str, list[Row]] = {}
        shares: dict[str, Share] = {job.share.tenant: job.share}
        for row in batch.rows:
            s = self._jobs[id(row)].share
            held.setdefault(s.tenant, []).append(row)
            shares.setdefault(s.tenant, s)
        weights = sum(s.weight for s in shares.values())

        def fair(t: str) -> float:
            return batch.max_rows * shares[t].weight / weights

        me = job.share.tenant
        if len(held.get(me, ())) + 1 > fair(me):
            return None
        over = [t for t in held if t != me and len(held[t]) > fair(t)]
        if not over:
            return None
        rows = held[max(over, key=lambda t: len(held[t]) - fair(t))]
        return max(rows, key=lambda r: self._jobs[id(r)].admitted_ns or 0)  # the last admitted

    def default_cap(self, job: Job, preempt: bool) -> int:
        """The job's tenant's row cap when its policy sets none: the whole batch where a
        tenant past its share gives rows up (preemption on, a cache that can park), else
        three quarters of it (serving/fairness.py `default_max_rows`)."""
        d = job.decode
        batch = None if d is None else self._batches.get(id(d.engine))
        parkable = d is not None and d.engine.parkable and (batch is None or batch.cache.parkable)
        return default_max_rows(self.rows_of(job), preempt and parkable)

    def park(self, row: Row) -> Job:
        """Take ``row`` out of its batch (engine `Batch.park`); its job, holding what it
        needs to resume, is returned to go back to the fair queue. If parking raises (out of
        memory), the row stays in its batch with its job."""
        job = self._jobs[id(row)]
        assert job.decode is not None
        job.parked = self._batches[id(job.decode.engine)].park(row)
        del self._jobs[id(row)]
        job.fair_wait = True
        key = id(job.decode.engine)
        self._parked[key] = self._parked.get(key, 0) + 1
        return job

    def unpark(self, decode: Decode) -> None:
        """A parked job of this decode's engine resumed or was dropped (cancelled)."""
        key = id(decode.engine)
        self._parked[key] = max(0, self._parked.get(key, 0) - 1)

    def step(self, pacer: StepPacer | None = None) -> list[tuple[Job, list[Event]]]:
        """One step of every batch. With a ``pacer`` (serving/fairness.py `StepPacer`), the
        rows of a tenant past its share of the batch's time sit the step out (their jobs
        are marked as having waited for fairness), and the step's time is charged to the
        tenants of the rows that took it."""
        out: list[tuple[Job, list[Event]]] = []
        for key, batch in list(self._batches.items()):
            if not batch.rows:
                continue
            held: list[Row] = []
            taking = [self._jobs[id(r)].share for r in batch.rows]
            if pacer is not None:
                sitting = pacer.pace(key, taking)
                held = [r for r in batch.rows if self._jobs[id(r)].share.tenant in sitting]
                taking = [s for s in taking if s.tenant not in sitting]
                for row in held:
                    self._jobs[id(row)].fair_wait = True
            t0 = time.perf_counter()
            try:
                stepped = batch.step(held)
            except Exception as exc:  # a shared forward failed (a bug, out of memory):
                # every row of the batch ends with the error instead of the thread dying
                # and every request hanging; the next arrival gets a fresh batch
                del self._batches[key]
                if pacer is not None:
                    pacer.forget(key)
                for row in batch.rows:
                    out.append((self._jobs.pop(id(row)), [exc]))
                continue
            if pacer is not None:
                pacer.spend(taking, time.perf_counter() - t0)
            for row, events in stepped:
                job = self._jobs[id(row)]
                if row.finished:
                    del self._jobs[id(row)]
                out.append((job, events))
        return out


def batch_rows(max_rows: int, kv_budget_tokens: int | None, context_length: int) -> int:
    """Rows of a target's batch: max_rows, capped by the KV budget (each row's slot holds
    the target's full context), at least one."""
    if kv_budget_tokens is None:
        return max_rows
    return max(1, min(max_rows, kv_budget_tokens // max(1, context_length)))
