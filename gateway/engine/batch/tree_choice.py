"""Whether draft trees pay at this batch size, learned from the batch's own steps (the cost
model's part for trees; scheduler.py asks before every step's proposals).

A tree buys tokens per step (more candidates at the depths where the draft is unsure) with
a wider verify feed and more draft forwards. Where a one-row verify forward costs little
more for 20 tokens than for 5 (it is bound by reading the weights), a tree may pay; in a
full batch the forward's cost grows with rows x tokens, and the padded width and the
shared draft forwards are every row's, so it stops paying. The rows of a step therefore
switch together: per row bucket (1, 2, 4, 8, ... rows, as batch/costs.py buckets them),
the target keeps moving averages of a step's tokens (all rows') and seconds (from the
proposals to the last row settled) for the steps its tree rows drafted trees and for those
they drafted chains, and each step takes the mode with the more tokens per second: a few
steps of each first, and every EXPLORE-th step the other mode, so that both stay measured
as the load changes. The averages live with the target model, so that every batch on it (a
gateway's, or the one-row batch a lone tree request decodes in) learns from all of them.

Which mode a step drafts in never changes what the verifier emits (both are exact). A
seeded sampled request keeps its tree on every step, so that its seed alone fixes its
text (the choice reads timings).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from gateway.engine.batch.costs import row_bucket
from gateway.engine.batch.rows import Row

ALPHA = 0.25  # weight of the newest step in the moving averages
WARM = 4  # steps of each mode (per row bucket) before choosing by rate
EXPLORE = 16  # every EXPLORE-th step runs the other mode


@dataclass
class ModeRate:
    """Moving averages over the steps of one mode at one row bucket."""

    tokens: float = 0.0  # emitted per step, all rows
    seconds: float = 0.0  # per step, from the proposals to the last row settled
    steps: int = 0

    def observe(self, tokens: int, seconds: float) -> None:
        a = 1.0 if self.steps == 0 else ALPHA
        self.tokens += a * (tokens - self.tokens)
        self.seconds += a * (seconds - self.seconds)
        self.steps += 1

    @property
    def rate(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


@dataclass
class Learned:
    """One target's tree and chain rates by row bucket."""

    modes: dict[int, dict[bool, ModeRate]] = field(default_factory=dict)
    steps: int = 0


_LEARNED: weakref.WeakKeyDictionary[Any, Learned] = weakref.WeakKeyDictionary()


def learned_for(model: Any) -> Learned:
    """The rates kept for `model` (a fresh set for a model that cannot be weakly keyed)."""
    try:
        return _LEARNED.setdefault(model, Learned())
    except TypeError:
        return Learned()


class TreeChoice:
    """A batch's tree switch."""

    def __init__(self, learned: Learned | None = None) -> None:
        self.learned = Learned() if learned is None else learned
        self._step: tuple[dict[bool, ModeRate], bool, float] | None = None

    def choose(self, rows: list[Row], batch: int) -> None:
        """Set `tree_on` on the proposers of `rows` that may draft a tree, in a step of
        `batch` decoding rows."""
        self._step = None
        switched = []
        for row in rows:
            p = row.cfg.proposer
            if getattr(p, "tree", None) is None:
                continue
            policy = row.cfg.policy
            if policy is None or not policy.measure_c:  # seeded sampled: always a tree
                p.tree_on = True  # type: ignore[union-attr]
            else:
                switched.append(p)
        if not switched:
            return
        fresh = {True: ModeRate(), False: ModeRate()}
        modes = self.learned.modes.setdefault(row_bucket(batch), fresh)
        self.learned.steps += 1
        on = pick(modes, self.learned.steps)
        for p in switched:
            p.tree_on = on  # type: ignore[union-attr]
        self._step = (modes, on, time.perf_counter())

    def observe(self, tokens: int) -> None:
        """The step chosen for has settled, emitting `tokens` in all."""
        if self._step is None:
            return
        modes, on, t0 = self._step
        modes[on].observe(tokens, time.perf_counter() - t0)
        self._step = None


def pick(modes: dict[bool, ModeRate], step: int) -> bool:
    """Trees (True) or chains this step, from the two modes' rates at this row bucket."""
    if modes[True].steps < WARM:
        return True
    if modes[False].steps < WARM:
        return False
    best = modes[True].rate >= modes[False].rate
    return not best if step % EXPLORE == 0 else best
