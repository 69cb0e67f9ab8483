"""Logits -> probabilities -> tokens. Pure functions over tensors (gpt-fast style).

Every distribution the engine samples from, or verifies against, is built the same way, for
the target (p) and for a draft model (q) alike:

    z   = logits + logit_bias                              (n, V)
    z_i = -inf   where token i is not allowed             (allowed / banned / grammar mask)
    p   = softmax(top_p(top_k(z / temperature)))           warped distribution

temperature == 0 means greedy: the token is argmax(z) and no sampling happens. Logprobs
reported for greedy are log_softmax(z) (temperature 1); for sampling they are log(p).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gateway.engine.schema import SamplingParams

NEG_INF = float("-inf")


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the top_k largest logits of each row (ties at the k-th value are kept too)."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (n, 1)
    return logits.masked_fill(logits < kth, NEG_INF)  # (n, V)


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose mass reaches top_p.

    Token i (in descending order) is dropped when the mass strictly before it is >= top_p,
    so the most likely token always survives.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (n, V)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)  # (n, V)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # (n, V)
    drop_sorted = mass_before >= top_p  # (n, V)
    # A top_p below float32's smallest value rounds to 0 in the comparison: the first token
    # must survive all the same (found by the fuzzer: top_p=5e-324 was a 500).
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)  # (n, V)
    return logits.masked_fill(drop, NEG_INF)


def warp(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """p = softmax(top_p(top_k(logits / temperature))), row-wise; temperature > 0."""
    z = logits / temperature  # (n, V)
    z = apply_top_k(z, top_k)
    z = apply_top_p(z, top_p)
    return torch.softmax(z, dim=-1)  # (n, V)


def argmax_rows(z: torch.Tensor) -> list[int]:
    """The greedy token of each row of z (n, V): `z.argmax(-1).tolist()`, the first maximum
    of a row (a NaN counts as the maximum). On the CPU in fp32 numpy's argmax, which follows
    the same rule and has a smaller fixed cost per call than torch's for a few rows: a
    greedy step takes one per verify and one per drafted token."""
    if z.device.type == "cpu" and z.dtype == torch.float32 and z.dim() == 2:
        return z.numpy().argmax(-1).tolist()  # type: ignore[no-any-return]
    return z.argmax(dim=-1).tolist()  # type: ignore[no-any-return]


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs (n, V) -> (n,), drawn with the request's generator."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (n,)


@dataclass(frozen=True)
class LogitsShaper:
    """A request's logit processing, bound to one vocabulary size and device.

    bias: (V,) additive logit bias or None; allowed: (V,) bool mask of the static
    allowed/banned lists, or None when every token is allowed. Applied identically to target
    and draft logits, so p and q are shaped the same way.
    """

    temperature: float
    top_p: float
    top_k: int
    bias: torch.Tensor | None
    allowed: torch.Tensor | None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @staticmethod
    def from_params(sp: SamplingParams, vocab_size: int, device: torch.device) -> LogitsShaper:
        """The shaper a request's sampling parameters ask for, on a vocabulary."""
        bias = None
        if sp.logit_bias:
            bias = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # (V,)
            ids = torch.tensor([i for i, _ in sp.logit_bias], dtype=torch.long, device=device)
            vals = torch.tensor([v for _, v in sp.logit_bias], dtype=torch.float32, device=device)
            bias.index_put_((ids,), vals, accumulate=True)
        allowed = None
        if sp.allowed_token_ids is not None or sp.banned_token_ids:
            allowed = torch.ones(vocab_size, dtype=torch.bool, device=device)  # (V,)
            if sp.allowed_token_ids is not None:
                allowed.zero_()
                allowed[torch.tensor(sp.allowed_token_ids, dtype=torch.long, device=device)] = True
            if sp.banned_token_ids:
                allowed[torch.tensor(sp.banned_token_ids, dtype=torch.long, device=device)] = False
        return LogitsShaper(sp.temperature, sp.top_p, sp.top_k, bias, allowed)

    def shape(self, logits: torch.Tensor, masks: torch.Tensor | None = None) -> torch.Tensor:
        """z = logits + bias, -inf outside allowed and outside masks (n, V) -> (n, V) fp32."""
        z = logits.float()  # (n, V)
        if self.bias is not None:
            z = z + self.bias  # (n, V)
        if self.allowed is not None:
            z = z.masked_fill(~self.allowed, NEG_INF)  # (n, V)
        if masks is not None:
            z = z.masked_fill(~masks, NEG_INF)  # (n, V)
        return z

    def probs(self, z: torch.Tensor) -> torch.Tensor:
        """Warped distribution of shaped logits z (n, V); only for temperature > 0."""
        return warp(z, self.temperature, self.top_p, self.top_k)  # (n, V)

    def logprobs(self, z: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
        """What the engine reports: log p when sampling, log_softmax(z) when greedy."""
        if probs is None:
            return torch.log_softmax(z, dim=-1)  # (n, V)
        return torch.log(probs)  # (n, V)
