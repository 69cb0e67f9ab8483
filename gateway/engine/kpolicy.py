"""Adaptive draft length k per request, on the cost model of gateway/costmodel.py.

Each step picks the k in [k_min, k_max] that maximises S(a, k, c) = E(a, k) / (k c + 1).
a is a decayed-count estimate (successes over trials, seeded with a prior), updated after
every verify step: m accepted of n drafted is m successes and (1 if m < n else 0) failures
(the geometric likelihood).

Inside a continuous batch every row's verify forward is padded to the longest, so the batch
picks one k for all its adaptive rows each step (batch/scheduler.py: the k that maximises
the batch's expected tokens per second at its measured forward costs) and sets `batch_k`;
a row whose request allows it (`may_pause`, auto mode) may then draft nothing for a step.

The prior is what the policy engine decided on (``KPrior``: the tenant's measured acceptance
and c for this proposer and draft version), so the first step's k is the decision's k; with
no prior, acceptance starts at DEFAULT_PRIOR and c at a static estimate (draft layers /
target layers: at small sizes per-layer overhead dominates). When `measure_c` is set, c then
follows the measured ratio. A seeded sampled request keeps the fixed prior and the static c:
k changes which random numbers each position consumes, so a k chosen from history or
wall-clock timings would make the same seed give different outputs. (Greedy output never
depends on k.)
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.costmodel import best_k

DEFAULT_PRIOR = 0.7


@dataclass(frozen=True)
class KPrior:
    """The decision's estimates for this request's proposer: acceptance a in [0, 1] and
    cost ratio c >= 0 (0 for a proposer whose cost is not measured yet)."""

    acceptance: float
    c: float


@dataclass
class KPolicy:
    k_min: int
    k_max: int
    prior: float = DEFAULT_PRIOR
    prior_weight: float = 4.0
    decay: float = 0.9
    successes: float = 0.0
    failures: float = 0.0
    c: float = 0.0
    measure_c: bool = True
    may_pause: bool = False  # a batch may set k = 0 for a step (see batch_k)
    batch_k: int | None = None  # this step's k chosen by the batch for all its rows

    @property
    def acceptance(self) -> float:
        a = (self.prior * self.prior_weight + self.successes) / (
            self.prior_weight + self.successes + self.failures
        )
        return min(max(a, 0.01), 0.99)

    def choose(self) -> int:
        """This step's k: the batch's pick when it made one (clamped to this request's
        bounds; 0 only when may_pause), else the best k for this request alone."""
        if self.batch_k is not None and self.measure_c:
            lo = 0 if self.may_pause else self.k_min
            return min(max(self.batch_k, lo), self.k_max)
        return best_k(self.acceptance, self.c, self.k_min, self.k_max)[0]

    def observe_c(self, measured: float | None) -> None:
        if self.measure_c and measured is not None:
            self.c = measured

    def update(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.successes = self.decay * self.successes + accepted
        self.failures = self.decay * self.failures + (1.0 if accepted < drafted else 0.0)


def static_c(target_config: object, draft_config: object) -> float:
    """Layer ratio of draft to target: a timing-free estimate of c."""

    def layers(cfg: object) -> int | None:
        for name in ("num_hidden_layers", "n_layer", "num_layers"):
            v = getattr(cfg, name, None)
            if isinstance(v, int) and v > 0:
                return v
        return None

    t, d = layers(target_config), layers(draft_config)
    return d / t if t and d else 0.2
