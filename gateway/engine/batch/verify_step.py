"""Steps 5-9 of a batch step (scheduler.py): ONE target forward over every planned row, then
each row settles as alone (loop.settle_step) and commits its slot.

A chain row feeds [last, d_1..d_n] at positions length.. and commits the accepted prefix by
its length alone. A tree row (tree_verifier.py) feeds [last, node_0..node_n-1], each node
at position length + its depth and attending to the committed keys and its ancestors only
(masks.py `tree_visible`); its nodes' keys and values are written at length + 1 + i. After
the verdict the accepted path's entries are gathered to length + 1, length + 2, ...
(slots.py `gather`), where a chain's would be, and the length commits them; the other
nodes' entries lie past it, never attended, overwritten by the next forward.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.batch.head_drafting import hand_features, step_tap
from gateway.engine.batch.rows import Event, Row, failed
from gateway.engine.loop import StepPlan, _measure_c, settle_step
from gateway.engine.tree_verifier import path_rows

if TYPE_CHECKING:
    from gateway.engine.batch.scheduler import Batch


def verify_rows(
    batch: Batch, plans: list[tuple[Row, StepPlan]], events: dict[int, list[Event]]
) -> float:
    """Verify and settle `plans`' rows in one forward; returns the forward's seconds."""
    t0 = time.perf_counter()
    feeds = [[row.ctx[-1], *plan.draft] for row, plan in plans]
    slots = [row.slot for row, _ in plans]
    tap = step_tap(row.cfg for row, _ in plans)  # hidden states for head rows
    trees = {i: plan.parents for i, (_, plan) in enumerate(plans) if plan.parents is not None}
    step = Step(batch.cache, slots, feeds, tap=tap, trees=trees or None)
    logits = batched_forward(batch.target.model, step, batch.target.fast)  # [(n_r + 1, V)]
    spent = time.perf_counter() - t0
    batch.forwards += 1
    batch.target_costs().observe(len(plans), max(len(f) for f in feeds), spent)
    emitted = 0
    for i, ((row, plan), z) in enumerate(zip(plans, logits, strict=True)):
        row.cfg.stats.batch_steps += 1
        row.cfg.stats.batch_rows += len(plans)
        row.forwards += 1
        row.decode_forwards += 1
        row.decode_forward_s += spent
        row.times.verify_s += spent
        cfg = row.cfg
        before = len(row.ctx)
        try:
            m = settle_step(cfg, row.ctx, plan, z, row.times)  # 6-8
        except Exception as exc:
            events[id(row)].append(failed(row, exc))
            continue
        rows = None
        if plan.path is not None:  # a tree: its accepted path where a chain's would be
            rows = path_rows(plan.path)
            batch.cache.gather(row.slot, before, [before - 1 + r for r in rows[1:]])
        batch.cache.length[row.slot] = before + m  # 7. every committed token but the last
        emitted += len(row.ctx) - before
        hand_features(cfg, tap, i, before - 1, m + 1, rows)  # a head row's committed states
        if cfg.policy is not None and cfg.proposer is not None:  # 9.
            cfg.policy.observe_c(_measure_c(cfg, row))  # type: ignore[arg-type]
        delta = cfg.output.delta()
        if delta is not None:
            events[id(row)].append(delta)
        if cfg.output.finish_reason is not None:
            events[id(row)] += batch.finish(row)
    batch.trees.observe(emitted)  # whether trees pay (tree_choice.py)
    return spent
