"""Draft-model proposer: a small LM with its own KV cache, rolled back after rejections."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from gateway.engine.constraints.base import Grammar, next_token_mask
from gateway.engine.draft_head import head_logits
from gateway.engine.models import LoadedModel, cache_kwarg, crop_cache, forward_logits
from gateway.engine.proposers.base import Proposal
from gateway.engine.sampling import LogitsShaper, sample


class DraftModelProposer:
    """Drafts autoregressively with `draft`, shaping its logits exactly like the target's.

    The cache holds the draft's KV for `self._fed`; each propose() crops it back to the
    longest prefix shared with the committed context (rejected tokens fall out) and feeds
    the rest, so after m accepted of n the next call feeds 1-2 tokens.

    Drafting stops early, before k, after a token the draft itself gave a probability below
    `min_confidence` (its own warped distribution): such a token is likely rejected, and
    every token drafted after it would be wasted. Where to stop never changes what the
    verifier emits (any draft length is exact), and it depends only on the draft's
    probabilities, never on timings, so a seed still fixes the output.

    A draft with a reduced head (`draft.draft_head`) drafts among its subset only: its
    distribution is zero elsewhere, and drafting stops when shaping leaves no token of the
    subset allowed (a logit_bias, token list or grammar outside it).
    """

    name = "draft"

    def __init__(
        self,
        draft: LoadedModel,
        shaper: LogitsShaper,
        generator: torch.Generator | None,
        grammar: Grammar | None = None,
        eos_token_ids: tuple[int, ...] = (),
        min_confidence: float = 0.0,
    ) -> None:
        self._model = draft.model
        self._device = draft.device
        self._vocab = draft.vocab_size
        self._shaper = shaper
        self._gen = generator
        self._grammar = grammar
        self._eos = frozenset(eos_token_ids)
        self._eos_ids = eos_token_ids
        self._min_conf = min_confidence
        self._kwarg = cache_kwarg(draft.model)
        self._head = draft.draft_head
        self._cache = DynamicCache()
        self._fed: list[int] = []
        self._stable = 0  # self._fed[:_stable] is known to equal the committed context
        self.forwards = 0
        self.forward_s = 0.0

    def _forward(self, ids: list[int]) -> torch.Tensor:
        t0 = time.perf_counter()
        if self._head is not None:
            logits = head_logits(
                self._model, self._head, self._kwarg, ids, self._cache, self._device, self._vocab
            )
        else:
            logits = forward_logits(self._model, self._kwarg, ids, self._cache, self._device, 1)
        self.forwards += 1
        self.forward_s += time.perf_counter() - t0
        self._fed.extend(ids)
        return logits

    def _sync(self, context: Sequence[int]) -> list[int]:
        """Crop the cache to the prefix shared with context[:-1]; return tokens to feed."""
        limit = min(len(self._fed), len(context) - 1)
        common = min(self._stable, limit)
        while common < limit and self._fed[common] == context[common]:
            common += 1
        if common < len(self._fed):
            crop_cache(self._cache, common)
            del self._fed[common:]
        self._stable = len(context)
        return list(context[common:])

    def propose(self, context_ids: Sequence[int], k: int) -> Proposal:
        feed = self._sync(context_ids)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for _ in range(k):
            logits = self._forward(feed)  # (1, V)
            mask = None
            if self._grammar is not None:
                mask = next_token_mask(self._grammar, self._vocab, self._eos_ids, self._device)
            z = self._shaper.shape(logits, None if mask is None else mask[None])  # (1, V)
            constrained = mask is not None or self._shaper.allowed is not None
            if constrained and not bool(torch.isfinite(z).any()):
                break  # nothing the draft can propose is allowed here (grammar, lists, subset)
            if self._shaper.greedy:
                tok = int(torch.argmax(z, dim=-1))
                conf = float(torch.softmax(z[0], dim=-1)[tok]) if self._min_conf > 0 else 1.0
            else:
                q = self._shaper.probs(z)  # (1, V)
                tok = int(sample(q, self._gen))
                rows.append(q)
                conf = float(q[0, tok])
            tokens.append(tok)
            if tok in self._eos or conf < self._min_conf:
                break
            if self._grammar is not None:
                self._grammar.consume(tok)
            feed = [tok]
        if self._grammar is not None:
            self._grammar.rollback(len(tokens) - (1 if tokens and tokens[-1] in self._eos else 0))
        probs = torch.cat(rows) if rows else None  # (n, V)
        return Proposal(tokens, probs)

    def on_verified(self, n_accepted: int) -> None:
        """Nothing to do: the next propose() crops the cache to the committed context."""
