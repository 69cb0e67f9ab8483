"""The cost model of speculative decoding (Leviathan, Kalman, Matias 2023), defined once.

With per-token acceptance rate a, draft length k and cost ratio c (one proposer step / one
target step), one verify step emits on average

    E(a, k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)     (k + 1 when a = 1)

tokens and costs k c + 1 target steps, so the expected speedup over standard decoding is

    S(a, k, c) = E(a, k) / (k c + 1).

Speculation can pay only when a > c. In a batch the verify forward of k + 1 tokens per row
costs v(k) standard steps (measured by the engine as a function of rows; 1 in the paper's
model), so S = E(a, k) / (k c + v(k)). The policy engine decides with it (policies/decide.py),
the engine's k policy picks each step's k with it (gateway/engine/kpolicy.py) and the
benchmarks compute their ideal with it. Pure Python; it imports nothing of ours.
"""

from __future__ import annotations

from collections.abc import Sequence


def expected_tokens(a: float, k: int) -> float:
    """E(a, k): tokens emitted per target forward with k drafted tokens."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {a}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def speedup(tokens_per_forward: float, k: float, c: float, verify_cost: float = 1.0) -> float:
    """E / (k c + verify_cost): the speedup of a verify step that emits E tokens on average
    after k drafted ones, the verify forward costing `verify_cost` standard steps (1 in the
    model). Benchmarks pass a measured E, mean k and verify cost for their ideal."""
    if c < 0.0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    return tokens_per_forward / (k * c + verify_cost)


def expected_speedup(a: float, k: int, c: float) -> float:
    """S(a, k, c) = (1 - a^(k+1)) / ((1 - a)(k c + 1))."""
    return speedup(expected_tokens(a, k), k, c)


def verify_cost_at(verify: Sequence[float] | None, k: int) -> float:
    """v(k) from a measured table v[0..K] (v[0] = 1): past its end the last slope goes on;
    no table: 1 (the verify forward costs one standard step, as in the paper)."""
    if not verify:
        return 1.0
    if k < len(verify):
        return verify[k]
    last = len(verify) - 1
    slope = max(0.0, verify[last] - verify[last - 1]) if last >= 1 else 0.0
    return verify[last] + slope * (k - last)


def best_k(
    a: float, c: float, k_min: int, k_max: int, verify: Sequence[float] | None = None
) -> tuple[int, float]:
    """The k in [k_min, k_max] that maximises E(a, k) / (k c + v(k)), and that value; v is
    the measured verify cost at the batch (see verify_cost_at), 1 when None. Ties go to the
    smallest k (less wasted draft work for the same expected speedup)."""
    if not 1 <= k_min <= k_max:
        raise ValueError(f"need 1 <= k_min <= k_max, got {k_min}, {k_max}")

    def s(k: int) -> float:
        return speedup(expected_tokens(a, k), k, c, verify_cost_at(verify, k))

    best = (k_min, s(k_min))
    for k in range(k_min + 1, k_max + 1):
        v = s(k)
        if v > best[1]:
            best = (k, v)
    return best
