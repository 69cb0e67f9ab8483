"""The head's training loss with training-time test (EAGLE-3, Li et al. 2025, section 3.3).

A batch is token windows x_0..x_{T-1} with the target's features f_j and logits z_j at
every position (one target forward, no gradient). Head position p (0..T-2) reads
(g_p, x_{p+1}) and is taught the target's distribution softmax(z_{p+1}) over x_{p+2}.

Drafting feeds the head its own outputs after the last committed position, so training
unrolls `steps` times: at step s, position p reads o^{s-1}_{p-1} (step s-1's output one
position back) in place of g_p, and attends to what drafting would have: the step-1 keys
of positions <= p - s + 1 (the committed ones, from target features) and, for i = 2..s,
the step-i key at position p - (s - i) (the chain drafted so far, its own last). Step s's
loss counts positions p >= s - 1 (the others have no such chain) with weight decay**(s-1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from gateway.feature_head import FeatureHead


def _shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """x (B, heads, n, ...) moved `by` positions later along dim 2, zeros first."""
    if by == 0:
        return x
    pad = torch.zeros_like(x[:, :, :by])
    return torch.cat([pad, x[:, :, :-by]], dim=2)


def unroll(
    head: FeatureHead, feats: torch.Tensor, tokens: torch.Tensor, steps: int
) -> Iterator[torch.Tensor]:
    """The head's outputs o^s (B, n, H) for s = 1..steps (see the module doc): feats
    (B, n, taps x H) of positions 0..n-1, tokens (B, n) the token after each (x_{p+1}).
    Step s's output at position p drafts x_{p+2} after a chain of s - 1 drafted tokens."""
    b, n, _ = feats.shape
    pos = torch.arange(n, device=feats.device)[None].expand(b, n)
    scale = 1.0 / math.sqrt(head.cfg.head_dim)
    causal = torch.ones(n, n, dtype=torch.bool, device=feats.device).tril()
    g = head.fuse(feats)  # (B, n, H)
    keys1 = values1 = None
    chain: list[tuple[torch.Tensor, torch.Tensor]] = []  # step i >= 2: (k_i, v_i)
    for s in range(1, steps + 1):
        q, k, v = head.project(g, tokens, pos)  # (B, heads, n, D)
        if s == 1:
            keys1, values1 = k, v
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        else:
            assert keys1 is not None and values1 is not None
            chain.append((k, v))
            seen = torch.ones(n, n, dtype=torch.bool, device=feats.device).tril(-(s - 1))
            scores = [(q @ keys1.transpose(-1, -2) * scale).masked_fill(~seen, float("-inf"))]
            shifted = []
            for i, (ki, vi) in enumerate(chain, start=2):  # step i's key at p - (s - i)
                ks, vs = _shift(ki, s - i), _shift(vi, s - i)
                scores.append((q * ks).sum(-1, keepdim=True) * scale)  # (B, heads, n, 1)
                shifted.append(vs)
            w = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
            attn = w[..., :n] @ values1
            for j, vs in enumerate(shifted):
                attn = attn + w[..., n + j : n + j + 1] * vs
        o = head.finish(g, attn)  # (B, n, H)
        yield o
        g = torch.cat([torch.zeros_like(o[:, :1]), o[:, :-1]], dim=1)  # o^{s}_{p-1} at p


def ttt_loss(
    head: FeatureHead,
    feats: torch.Tensor,
    tokens: torch.Tensor,
    teacher: torch.Tensor,
    steps: int,
    decay: float = 0.8,
) -> tuple[torch.Tensor, list[float]]:
    """feats (B, n, taps x H): target features of positions 0..n-1; tokens (B, n): the
    token after each (x_{p+1}); teacher (B, n, N): the target's probabilities of the token
    after that (over the head's vocabulary, reduced or not). Returns the weighted loss and
    each step's top-1 agreement with the teacher (on its counted positions)."""
    total = feats.new_zeros(())
    weight_sum = 0.0
    agree: list[float] = []
    best = teacher.argmax(-1)  # (B, n)
    for s, o in enumerate(unroll(head, feats, tokens, steps), start=1):
        logp = torch.log_softmax(head.logits(o).float(), dim=-1)  # (B, n, N)
        first = s - 1  # positions with a chain of s - 1 drafted before them
        ce = -(teacher[:, first:] * logp[:, first:]).sum(-1).mean()
        wt = decay ** (s - 1)
        total = total + wt * ce
        weight_sum += wt
        agree.append(float((logp[:, first:].argmax(-1) == best[:, first:]).float().mean()))
    return total / weight_sum, agree
