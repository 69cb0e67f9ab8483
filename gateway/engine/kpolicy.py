"""Adaptive draft length k per request (Leviathan et al.'s cost model).

With per-token acceptance rate a and cost ratio c = draft step / target step, one verify
step with k drafted tokens emits E(k) = (1 - a^(k+1)) / (1 - a) tokens on average and costs
k c + 1 target steps, so the throughput gain is

    g(k) = (1 - a^(k+1)) / ((1 - a) (k c + 1)),

and we choose k in [k_min, k_max] maximising it. a is a decayed-count estimate (successes
over trials, seeded with a prior), updated after every verify step: m accepted of n drafted
is m successes and (1 if m < n else 0) failures (the geometric likelihood).

c starts from a static estimate (draft layers / target layers: at small sizes per-layer
overhead dominates) and, when `measure_c` is set, follows the measured ratio. A seeded
sampled request keeps the static c: k changes which random numbers each position consumes,
so a k chosen from wall-clock timings would make the same seed give different outputs.
(Greedy output never depends on k.)
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens(a: float, k: int) -> float:
    """E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def speedup(a: float, k: int, c: float) -> float:
    """g(k) = E(k) / (k c + 1): the ideal speedup over standard decoding."""
    return expected_tokens(a, k) / (k * c + 1.0)


def best_k(a: float, c: float, k_min: int, k_max: int) -> int:
    """argmax over k in [k_min, k_max] of g(k); the smallest k on ties."""
    return max(range(k_min, k_max + 1), key=lambda k: (speedup(a, k, c), -k))


@dataclass
class KPolicy:
    k_min: int
    k_max: int
    prior: float = 0.7
    prior_weight: float = 4.0
    decay: float = 0.9
    successes: float = 0.0
    failures: float = 0.0
    c: float = 0.0
    measure_c: bool = True

    @property
    def acceptance(self) -> float:
        a = (self.prior * self.prior_weight + self.successes) / (
            self.prior_weight + self.successes + self.failures
        )
        return min(max(a, 0.01), 0.99)

    def choose(self) -> int:
        return best_k(self.acceptance, self.c, self.k_min, self.k_max)

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
