"""A draft model's reduced output head: its logits over a fixed subset of the vocabulary.

On a CPU a small draft spends most of a step reading its output embedding (for the demo
draft, 1.6M of its 2.0M parameters), so drafting only among the N most frequent tokens
(a frequency-ranked draft vocabulary, as in FR-Spec, Zhao et al. 2025) makes each draft
step much cheaper for a small loss in acceptance. Exactness does not depend on it: the
draft proposes from a distribution that is zero outside the subset, and the verifier
accepts and corrects against the target as for any other draft distribution.

A model directory opts in with `draft_vocab.json` = {"token_ids": [...], ...}; building
the head checks once that the model's logits really are `lm_head(last hidden state)`
(models with logit soft-capping or scaling are refused with a clear error).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

DRAFT_VOCAB_FILE = "draft_vocab.json"


class DraftHead(torch.nn.Module):
    """The reduced head: hidden states (..., H) -> logits (..., V) over the full vocabulary,
    -inf outside the subset. A module (its tensors buffers), so that a faster forward can
    run it inside its own (gateway/speed)."""

    token_ids: torch.Tensor  # (N,) sorted, unique
    weight: torch.Tensor  # (N, H) rows of the output embedding
    bias: torch.Tensor | None  # (N,)

    def __init__(
        self, token_ids: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
        vocab: int,
    ) -> None:  # fmt: skip
        super().__init__()
        self.register_buffer("token_ids", token_ids)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.vocab = vocab
        self.linear: Callable[..., torch.Tensor] | None = None
        """Its product (x, weight, bias); None: torch's F.linear. The speed package sets it
        where it gives the model's linear layers another form (gateway/speed/cpu_linear.py)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        product = F.linear if self.linear is None else self.linear
        sub = product(h, self.weight, self.bias)  # (..., N)
        full = h.new_full((*h.shape[:-1], self.vocab), float("-inf"))  # (..., V)
        return full.index_copy_(-1, self.token_ids, sub)


def read_draft_vocab(model_dir: str | Path) -> list[int] | None:
    path = Path(model_dir) / DRAFT_VOCAB_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    ids = data.get("token_ids") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError(f"{path}: expected {{'token_ids': [int, ...]}}")
    return ids


def build_head(model: Any, token_ids: list[int]) -> DraftHead:
    """Slice `model`'s output embedding to `token_ids`, after checking that its logits are
    lm_head(hidden) (so the reduced head gives the full logits on the subset)."""
    head = model.get_output_embeddings()
    vocab = int(head.weight.shape[0])
    ids = sorted(set(token_ids))
    if not ids or ids[0] < 0 or ids[-1] >= vocab:
        raise ValueError(f"draft vocabulary must be non-empty ids in [0, {vocab})")
    device = head.weight.device
    idx = torch.tensor(ids, dtype=torch.long, device=device)
    bias = getattr(head, "bias", None)
    out = DraftHead(
        token_ids=idx,
        weight=head.weight.detach()[idx].contiguous(),
        bias=None if bias is None else bias.detach()[idx].contiguous(),
        vocab=vocab,
    )
    # The check applies the model's own head module to the backbone output (same kernel, so
    # no accumulation-order noise, even in bf16); slicing its rows is then exact.
    probe = torch.arange(min(4, vocab), device=device)[None]  # (1, 4)
    with torch.inference_mode():
        full = model(input_ids=probe, use_cache=False).logits[0].float()  # (4, V)
        h = model.base_model(input_ids=probe, use_cache=False).last_hidden_state[0]  # (4, H)
        mine = head(h).float()  # (4, V)
    tol = 4 * torch.finfo(head.weight.dtype).eps * float(full.abs().max())
    if not torch.allclose(full, mine, rtol=0, atol=tol):
        raise ValueError(
            f"{type(model).__name__}: its logits are not lm_head(last hidden state) "
            "(soft-capping or scaling?), so it cannot draft with a reduced vocabulary"
        )
    return out


def head_logits(
    model: Any,
    head: DraftHead,
    kwarg: str,
    ids: list[int],
    cache: Any,
    device: torch.device,
) -> torch.Tensor:
    """One KV-cached forward of `ids`: the last position's logits over the full vocabulary,
    -inf outside the head's subset. Returns (1, V)."""
    h = forward_hidden(model, kwarg, ids, cache, device)  # (H,)
    return head(h[None])  # (1, V)


def forward_hidden(
    model: Any, kwarg: str, ids: list[int], cache: Any, device: torch.device
) -> torch.Tensor:
    """One KV-cached forward of `ids` through the backbone only: the last position's
    hidden state (H,)."""
    x = torch.tensor([ids], dtype=torch.long, device=device)  # (1, t)
    out = model.base_model(input_ids=x, use_cache=True, **{kwarg: cache})
    return out.last_hidden_state[0, -1]  # (H,)
