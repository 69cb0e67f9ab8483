"""Verification of drafted tokens against the target. Pure functions over tensors.

One verify step scores the target on [last committed token, d_1, ..., d_n] in ONE forward,
which yields n + 1 target distributions p_1..p_{n+1} (p_j is the distribution of the token
at draft position j given the context and d_1..d_{j-1}). With q_j the draft's distribution
for d_j (one-hot at d_j when the proposer has no probabilities: prompt lookup, prediction):

- accepted: the longest prefix d_1..d_m the verifier keeps. Greedy: d_j == argmax p_j.
  Sampling: d_j is kept with probability min(1, p_j(d_j) / q_j(d_j)), in order, until the
  first rejection.
- recovered: at the first rejection (m < n) the token emitted in place of d_{m+1}.
  Greedy: argmax p_{m+1}. Sampling: a sample of normalize(max(0, p_{m+1} - q_{m+1})).
- bonus: when all n are accepted, one more token from p_{n+1} (argmax when greedy).

So every verify step emits m + 1 tokens: the accepted ones and then one recovered or bonus
token. Sampling this way emits exactly the target distribution p (Leviathan et al. 2023,
Chen et al. 2023): for any token x at position j,
    P(x) = q(x) min(1, p(x)/q(x)) + (1 - sum_y min(p(y), q(y))) * max(0, p(x) - q(x)) / Z
         = min(p(x), q(x)) + max(0, p(x) - q(x)) = p(x),   with Z = sum_y max(0, p(y) - q(y)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    """accepted: how many draft tokens were kept; token: the recovered or bonus token."""

    accepted: int
    token: int


def verify_greedy(draft: list[int], target_argmax: list[int]) -> Verdict:
    """Accept while d_j == argmax p_j; then emit argmax p_{m+1} (recovered or bonus).

    target_argmax has len(draft) + 1 entries.
    """
    m = 0
    for d, t in zip(draft, target_argmax, strict=False):
        if d != t:
            break
        m += 1
    return Verdict(m, target_argmax[m])


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) for drafted tokens x (q(x) > 0 because x was drawn from q)."""
    return torch.clamp(p_x / q_x, max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) over the last dim; falls back to p where the mass is 0.

    Zero mass means p == q, where rejection has probability 0; the fallback only guards
    against rounding.
    """
    r = torch.clamp(p - q, min=0.0)  # (..., V)
    mass = r.sum(dim=-1, keepdim=True)  # (..., 1)
    return torch.where(mass > 0, r / mass.clamp(min=1e-30), p)  # (..., V)


def one_hot_rows(tokens: torch.Tensor, vocab_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The draft distribution of a proposer without probabilities: one-hot (n,) -> (n, V)."""
    out = torch.zeros(tokens.shape[0], vocab_size, dtype=dtype, device=tokens.device)
    return out.scatter_(1, tokens[:, None], 1.0)  # (n, V)


def verify_sampled(
    draft: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Rejection sampling. draft (n,) long; draft_probs (n, V) or None (one-hot);
    target_probs (n + 1, V). Draws n uniforms, then one token from the residual or p_{n+1}.
    """
    n = draft.shape[0]
    m = n
    if n:
        rows = torch.arange(n, device=draft.device)  # (n,)
        p_x = target_probs[rows, draft]  # (n,)
        q_x = draft_probs[rows, draft] if draft_probs is not None else torch.ones_like(p_x)
        u = torch.rand(n, generator=generator, device=target_probs.device)  # (n,)
        # u < min(1, p/q)  <=>  u * q < p  (no division; q(x) > 0)
        rejected = (u * q_x >= p_x).nonzero()  # (r, 1)
        if rejected.numel():
            m = int(rejected[0, 0])
    if m < n:
        q_m = (
            draft_probs[m]
            if draft_probs is not None
            else one_hot_rows(draft[m : m + 1], target_probs.shape[-1], target_probs.dtype)[0]
        )  # (V,)
        dist = residual(target_probs[m], q_m)  # (V,)
    else:
        dist = target_probs[n]  # (V,)
    token = torch.multinomial(dist, 1, generator=generator)  # (1,)
    return Verdict(m, int(token))
