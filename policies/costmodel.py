"""The cost model (Leviathan et al. 2023) and the acceptance history update. Pure functions.

With acceptance rate a, draft length k and cost ratio c (one proposer step / one target step):

    expected tokens per target forward  E(a, k) = (1 - a^(k+1)) / (1 - a)     (k + 1 when a = 1)
    expected speedup                  S(a, k, c) = E(a, k) / (k c + 1)

Speculation can pay only when a > c; the best k is found by scanning the policy's bounds.
"""

from __future__ import annotations

import math

from policies.types import HistoryEntry


def expected_tokens(a: float, k: int) -> float:
    """E(a, k): tokens emitted per target forward with k drafted tokens."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {a}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_speedup(a: float, k: int, c: float) -> float:
    """S(a, k, c) = (1 - a^(k+1)) / ((1 - a)(k c + 1))."""
    if c < 0.0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    return expected_tokens(a, k) / (k * c + 1.0)


def best_k(a: float, c: float, k_min: int, k_max: int) -> tuple[int, float]:
    """The k in [k_min, k_max] that maximises S(a, k, c), and that S.

    Ties go to the smallest k (less wasted draft work for the same expected speedup).
    """
    if not 1 <= k_min <= k_max:
        raise ValueError(f"need 1 <= k_min <= k_max, got {k_min}, {k_max}")
    best = (k_min, expected_speedup(a, k_min, c))
    for k in range(k_min + 1, k_max + 1):
        s = expected_speedup(a, k, c)
        if s > best[1]:
            best = (k, s)
    return best


def alpha_from_half_life(half_life: float) -> float:
    """EWMA weight of the newest sample such that an old sample's weight halves every
    `half_life` requests: (1 - alpha) ** half_life == 0.5."""
    if half_life <= 0:
        raise ValueError(f"half_life must be > 0, got {half_life}")
    return 1.0 - 0.5 ** (1.0 / half_life)


def update_history(
    entry: HistoryEntry | None, drafted: int, accepted: int, c: float | None, alpha: float
) -> HistoryEntry:
    """Fold one finished speculative request into the history.

    - acceptance: EWMA of accepted / drafted with weight `alpha` on the new request; the first
      request initialises it. A request that drafted nothing carries no acceptance evidence:
      acceptance and samples stay as they were (only c is updated).
    - c: EWMA of the measured cost ratio; None keeps the previous value (0.0 for a new entry:
      unmeasured proposer cost counts as negligible until measured).
    - samples: +1 per request that drafted at least one token.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if drafted < 0 or not 0 <= accepted <= drafted:
        raise ValueError(
            f"need 0 <= accepted <= drafted, got accepted={accepted} drafted={drafted}"
        )
    if c is not None and (c < 0.0 or not math.isfinite(c)):
        raise ValueError(f"cost ratio c must be finite and >= 0, got {c}")

    if entry is None:
        new_c = 0.0 if c is None else c
        if drafted == 0:
            return HistoryEntry(acceptance=0.0, c=new_c, samples=0)
        return HistoryEntry(acceptance=accepted / drafted, c=new_c, samples=1)

    new_c = entry.c if c is None else ewma(entry.c, c, alpha)
    if drafted == 0:
        return HistoryEntry(acceptance=entry.acceptance, c=new_c, samples=entry.samples)
    observed = accepted / drafted
    acceptance = observed if entry.samples == 0 else ewma(entry.acceptance, observed, alpha)
    return HistoryEntry(acceptance=acceptance, c=new_c, samples=entry.samples + 1)


def ewma(old: float, new: float, alpha: float) -> float:
    return (1.0 - alpha) * old + alpha * new
