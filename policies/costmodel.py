"""The acceptance history update (pure functions) and the cost model, which is defined
once in gateway/costmodel.py (E(a, k), S(a, k, c), best k) and re-exported here."""

from __future__ import annotations

import math

from gateway.costmodel import best_k, expected_speedup, expected_tokens, verify_cost_at
from policies.types import HistoryEntry

__all__ = [
    "alpha_from_half_life",
    "best_k",
    "ewma",
    "expected_speedup",
    "expected_tokens",
    "update_history",
    "verify_cost_at",
]


def alpha_from_half_life(half_life: float) -> float:
    """EWMA weight of the newest sample such that an old sample's weight halves every
    `half_life` requests: (1 - alpha) ** half_life == 0.5."""
    if half_life <= 0:
        raise ValueError(f"half_life must be > 0, got {half_life}")
    return 1.0 - 0.5 ** (1.0 / half_life)


def update_history(
    entry: HistoryEntry | None, drafted: int, accepted: int, c: float | None, alpha: float,
    rejections: int | None = None,
) -> HistoryEntry:  # fmt: skip
    """Fold one finished speculative request into the history.

    - acceptance: EWMA, with weight `alpha` on the new request, of the request's per-token
      acceptance rate, the a of E(a, k): accepted / (accepted + rejections), where
      `rejections` counts its verify steps that rejected a drafted token. That is the rate's
      maximum-likelihood estimate when each drafted token is accepted with probability a
      until the first rejection (the model E(a, k) assumes). accepted / drafted, used when
      `rejections` is None, underestimates it: tokens drafted after a rejected one are
      never tried (a = 0.8 drafting 4 a step gives about 0.59). The first request
      initialises it. A request that drafted nothing carries no acceptance evidence:
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
    if rejections is not None and not 0 <= rejections <= drafted - accepted:
        raise ValueError(f"need 0 <= rejections <= drafted - accepted, got rejections={rejections}")
    tried = drafted if rejections is None else accepted + rejections  # 0: no evidence

    if entry is None:
        new_c = 0.0 if c is None else c
        if tried == 0:
            return HistoryEntry(acceptance=0.0, c=new_c, samples=0)
        return HistoryEntry(acceptance=accepted / tried, c=new_c, samples=1)

    new_c = entry.c if c is None else ewma(entry.c, c, alpha)
    if tried == 0:
        return HistoryEntry(acceptance=entry.acceptance, c=new_c, samples=entry.samples)
    observed = accepted / tried
    acceptance = observed if entry.samples == 0 else ewma(entry.acceptance, observed, alpha)
    return HistoryEntry(acceptance=acceptance, c=new_c, samples=entry.samples + 1)


def ewma(old: float, new: float, alpha: float) -> float:
    return (1.0 - alpha) * old + alpha * new
