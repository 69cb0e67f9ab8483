"""The continuous batch of each target engine on the inference thread, and which job
each row belongs to (serving/worker.py steps them every round)."""

from __future__ import annotations

import time

from gateway.engine import PREFILL_BUDGET, PREFILL_CHUNK, Batch, Engine, Event, Row
from gateway.serving.fairness import StepPacer
from gateway.serving.jobs import Job


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
        """The job's row joins its engine's batch; returns the prompt tokens it will
        prefill (those a kept prefix does not already hold)."""
        d = job.decode
        assert d is not None
        batch = self._batches.get(id(d.engine))
        if batch is None:
            rows = self.rows_of(job)
            batch = d.engine.batch(rows, self.prefill_chunk, self.prefill_budget)
            self._batches[id(d.engine)] = batch
        row = batch.add(d.engine.prepare(d.request, d.draft), job.cancelled.is_set)
        self._jobs[id(row)] = job
        return len(row.cfg.prompt_ids) - row.prefilled

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
