"""Whether a row's draft tree pays at this batch, learned per row (the cost model's part
for trees; scheduler.py asks before every step's proposals).

A tree buys tokens per step (more candidates at the depths where the draft is unsure) with
a wider verify feed and more draft forwards. Alone on this CPU the verify forward of 20
tokens costs little more than one of 5, so the tree pays; in a full batch the forward's
cost grows with rows x tokens and the padded width is every row's, so it stops paying.

Per row that may draft a tree, the batch keeps, for the steps it drafted a tree and those
it drafted a chain, moving averages of the tokens it emitted, the tokens it fed and its
drafting seconds. Each step it drafts in the mode with the better rate,

    tokens per step / (T(rows, fed tokens) + drafting seconds),

T from the batch's measured forward costs (batch/costs.py) at the current rows; a few steps
of each mode first, and every EXPLORE-th step the other mode, so that both stay measured
as the batch changes. Which mode a step drafts in never changes what the verifier emits
(both are exact); a seeded sampled request keeps its tree on every step, so that its seed
alone fixes its text (the choice reads timings).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.engine.batch.costs import ForwardCosts
from gateway.engine.batch.rows import Row

ALPHA = 0.25  # weight of the newest step in the moving averages
WARM = 4  # steps of each mode before choosing by rate
EXPLORE = 16  # every EXPLORE-th step runs the other mode


@dataclass
class ModeStats:
    """Moving averages over the steps one row drafted in one mode."""

    tokens: float = 0.0  # emitted per step
    fed: float = 0.0  # tokens fed to the verify forward per step
    draft_s: float = 0.0  # drafting seconds per step
    steps: int = 0

    def observe(self, tokens: int, fed: int, draft_s: float) -> None:
        a = 1.0 if self.steps == 0 else ALPHA
        self.tokens += a * (tokens - self.tokens)
        self.fed += a * (fed - self.fed)
        self.draft_s += a * (draft_s - self.draft_s)
        self.steps += 1

    def rate(self, costs: ForwardCosts, rows: int) -> float | None:
        verify = costs.seconds(rows, max(1, round(self.fed)))
        if verify is None:
            return None
        return self.tokens / max(verify + self.draft_s, 1e-9)


@dataclass
class RowTrees:
    tree: ModeStats = field(default_factory=ModeStats)
    chain: ModeStats = field(default_factory=ModeStats)
    steps: int = 0
    drafted_s: float = 0.0  # the row's drafting seconds when this step began


class TreeChoice:
    """The per-row tree switches of one batch."""

    def __init__(self) -> None:
        self.rows: dict[int, RowTrees] = {}

    def choose(self, rows: list[Row], costs: ForwardCosts | None, batch: int) -> None:
        """Set `tree_on` on the proposers of `rows` that may draft a tree, in a step of
        `batch` decoding rows."""
        for row in rows:
            p = row.cfg.proposer
            if getattr(p, "tree", None) is None:
                continue
            state = self.rows.setdefault(id(row), RowTrees())
            state.drafted_s = row.times.draft_s
            policy = row.cfg.policy
            fixed = policy is None or not policy.measure_c  # seeded sampled: always a tree
            p.tree_on = True if fixed else _pick(state, costs, batch)  # type: ignore[union-attr]

    def observe(self, row: Row, tree: bool, emitted: int, fed: int) -> None:
        """A step of `row` settled: it drafted a tree (or a chain), emitted and fed so many."""
        state = self.rows.get(id(row))
        if state is None:
            return
        mode = state.tree if tree else state.chain
        mode.observe(emitted, fed, row.times.draft_s - state.drafted_s)

    def leave(self, row: Row) -> None:
        self.rows.pop(id(row), None)


def _pick(state: RowTrees, costs: ForwardCosts | None, rows: int) -> bool:
    state.steps += 1
    if state.tree.steps < WARM:
        return True
    if state.chain.steps < WARM:
        return False
    tree = chain = None
    if costs is not None:
        tree, chain = state.tree.rate(costs, rows), state.chain.rate(costs, rows)
    best = True if tree is None or chain is None else tree >= chain
    return not best if state.steps % EXPLORE == 0 else best
