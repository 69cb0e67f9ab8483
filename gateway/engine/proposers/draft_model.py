"""Draft-model proposer: a small LM with its own KV cache, rolled back after rejections."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import DynamicCache

from gateway.engine.constraints.base import Grammar, next_token_mask
from gateway.engine.draft_head import head_logits
from gateway.engine.models import LoadedModel, cache_kwarg, crop_cache, forward_logits
from gateway.engine.proposers.base import Proposal
from gateway.engine.proposers.tree import Side, TreeNodes, TreeShape, side_tokens
from gateway.engine.sampling import LogitsShaper, argmax_rows, sample


class DraftKV(Protocol):
    """Where a proposer's draft KV lives: its own DynamicCache, or a slot of a batch's
    draft SlotCache (gateway/engine/batch/drafting.py), which runs the forwards itself."""

    def crop(self, length: int) -> None: ...


class _OwnCache:
    def __init__(self) -> None:
        self.cache = DynamicCache()

    def crop(self, length: int) -> None:
        crop_cache(self.cache, length)


class DraftModelProposer:
    """Drafts autoregressively with `draft`, shaping its logits exactly like the target's.

    The cache holds the draft's KV for `self._fed`; each proposal crops it back to the
    longest prefix shared with the committed context (rejected tokens fall out) and feeds
    the rest, so after m accepted of n the next call feeds 1-2 tokens.

    A proposal is three verbs, so that a batch can run the forwards of many proposers in
    one (batch/drafting.py): `begin` (sync, first feed), `take` (one forward's logits ->
    the next feed, or None when drafting stops), `end` (the Proposal). `propose` runs them
    alone, on the proposer's own cache. The tokens depend only on the logits, this row's
    shaper, grammar and generator, never on who shares the forward.

    Drafting stops early, before k, after a token the draft itself gave a probability below
    `min_confidence` (its own warped distribution): such a token is likely rejected, and
    every token drafted after it would be wasted. Where to stop never changes what the
    verifier emits (any draft length is exact), and it depends only on the draft's
    probabilities, never on timings, so a seed still fixes the output.

    A draft with a reduced head (`draft.draft_head`) drafts among its subset only: its
    distribution is zero elsewhere, and drafting stops when shaping leaves no token of the
    subset allowed (a logit_bias, token list or grammar outside it).

    With a tree shape (proposers/tree.py) a proposal is a tree: after the main chain stops,
    `take` crops the draft's KV back to each side child's parent (and the grammar to its
    state there) and feeds the side child, drafting its side chain in the same verbs, so a
    batch runs those forwards shared as it runs the chain's.
    """

    name = "draft"

    def shared_draft(self) -> DraftModelProposer:
        """A batch drafts for it in its draft model's shared forwards (base.py)."""
        return self

    def __init__(
        self,
        draft: LoadedModel,
        shaper: LogitsShaper,
        generator: torch.Generator | None,
        grammar: Grammar | None = None,
        eos_token_ids: tuple[int, ...] = (),
        min_confidence: float = 0.0,
        tree: TreeShape | None = None,
    ) -> None:
        self.draft = draft
        self.tree = tree
        self.tree_on = True  # off: this proposal drafts a chain (batch/tree_choice.py)
        self._shape: TreeShape | None = None  # this proposal's tree shape
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
        self._own = _OwnCache()
        self.kv: DraftKV = self._own
        self._fed: list[int] = []
        self._stable = 0  # self._fed[:_stable] is known to equal the committed context
        self._k = 0
        self._tokens: list[int] = []
        self._rows: list[torch.Tensor] = []
        self._consumed = 0  # draft tokens consumed into the grammar by this proposal
        self._nodes = TreeNodes()  # a tree proposal's nodes (tree is not None)
        self._at = -1  # the node the next drafted token hangs from (-1: the root)
        self._depth = 1  # the next drafted token's depth
        self._limit = 0  # the depth the chain being drafted stops at
        self._main = True  # drafting the main chain (side children are taken there only)
        self.forwards = 0
        self.forward_s = 0.0

    @property
    def fed(self) -> int:
        """Tokens in the draft's KV cache."""
        return len(self._fed)

    @property
    def fed_ids(self) -> tuple[int, ...]:
        """The tokens in the draft's KV cache, in order."""
        return tuple(self._fed)

    def use_kv(self, kv: DraftKV, fed: Sequence[int] = ()) -> None:
        """Keep the draft KV in `kv` from now on (a batch slot holding `fed`)."""
        self.kv = kv
        self._fed = list(fed)
        self._stable = 0

    def fed_tokens(self, ids: Sequence[int], spent_s: float, step: bool = True) -> None:
        """A forward of `ids` went into this proposer's KV, taking `spent_s`; step: it was a
        drafting step (counted in forwards and c), not a prompt prefill."""
        self._fed.extend(ids)
        if step:
            self.forwards += 1
            self.forward_s += spent_s

    # -- the three verbs --------------------------------------------------------------------

    def begin(self, context_ids: Sequence[int], k: int) -> list[int] | None:
        """Start a proposal of up to k tokens: the tokens to feed first (None: k == 0)."""
        self._k, self._tokens, self._rows, self._consumed = k, [], [], 0
        self._nodes, self._at, self._depth, self._limit, self._main = TreeNodes(), -1, 1, k, True
        self._shape = self.tree if self.tree_on else None
        feed = self._sync(context_ids)
        return feed if k > 0 else None

    def take(self, logits: torch.Tensor) -> list[int] | None:
        """The draft's logits after the last feed, (1, V): draft one token; the next feed,
        or None when drafting stops (k reached, EOS, low confidence, nothing allowed)."""
        mask = None
        if self._grammar is not None:
            mask = next_token_mask(self._grammar, self._vocab, self._eos_ids, self._device)
        z = self._shaper.shape(logits, None if mask is None else mask[None])  # (1, V)
        constrained = mask is not None or self._shaper.allowed is not None
        if constrained and not bool(torch.isfinite(z).any()):
            # nothing the draft can propose is allowed here (grammar, lists, subset)
            return self._next_side() if self._shape is not None else None
        if self._shaper.greedy:
            tok = argmax_rows(z)[0]
            conf = float(torch.softmax(z[0], dim=-1)[tok]) if self._min_conf > 0 else 1.0
            q = None
        else:
            q = self._shaper.probs(z)  # (1, V)
            tok = int(sample(q, self._gen))
            self._rows.append(q)
            conf = float(q[0, tok])
        if self._shape is not None:
            return self._tree_take(z, q, tok, conf)
        self._tokens.append(tok)
        if tok in self._eos or conf < self._min_conf or len(self._tokens) >= self._k:
            return None
        if self._grammar is not None:
            self._grammar.consume(tok)
            self._consumed += 1
        return [tok]

    def _tree_take(
        self, z: torch.Tensor, q: torch.Tensor | None, tok: int, conf: float
    ) -> list[int] | None:
        """`take` for a tree: the token joins the chain being drafted; at a main-chain
        depth the shape branches at, its side children are noted (with where the KV and
        the grammar stand); when the chain stops, the next side chain starts."""
        assert self._shape is not None
        nodes = self._nodes
        node = nodes.add(tok, self._at, q)
        if self._main:
            state = (len(self._fed), self._consumed)
            for side in side_tokens(z, tok, self._shape.sides(self._depth), q, self._gen):
                nodes.pending.append(Side(self._at, self._depth, side, q, state))
        if tok in self._eos or conf < self._min_conf or self._depth >= self._limit:
            return self._next_side()
        self._advance(node, tok)
        return [tok]

    def _advance(self, node: int, tok: int) -> None:
        if self._grammar is not None:
            self._grammar.consume(tok)
            self._consumed += 1
        self._at, self._depth = node, self._depth + 1

    def _next_side(self) -> list[int] | None:
        """Start the next side chain: back to its parent's KV and grammar state, its first
        token drafted already; the feed (None: no side child left to draft on)."""
        assert self._shape is not None
        nodes = self._nodes
        while nodes.pending:
            side = nodes.pending.pop(0)
            fed, consumed = side.state
            if fed < len(self._fed):
                self.kv.crop(fed)
                del self._fed[fed:]
            if self._grammar is not None and self._consumed > consumed:
                self._grammar.rollback(self._consumed - consumed)
            self._consumed = consumed
            node = nodes.add(side.token, side.parent, side.q)
            self._main, self._depth = False, side.depth
            self._limit = min(self._k, side.depth + self._shape.branch - 1)
            if side.token in self._eos or side.depth >= self._limit:
                continue
            self._advance(node, side.token)
            return [side.token]
        return None

    def end(self) -> Proposal:
        """The proposal; the grammar is back where `begin` found it."""
        if self._grammar is not None and self._consumed:
            self._grammar.rollback(self._consumed)
        if self._shape is not None:
            nodes = self._nodes
            probs = torch.cat(nodes.rows) if nodes.rows else None  # (n, V)
            return Proposal(list(nodes.tokens), probs, list(nodes.parents))
        probs = torch.cat(self._rows) if self._rows else None  # (n, V)
        return Proposal(list(self._tokens), probs)

    def propose(self, context_ids: Sequence[int], k: int) -> Proposal:
        feed = self.begin(context_ids, k)
        while feed is not None:
            feed = self.take(self.forward(feed))  # (1, V)
        return self.end()

    def on_verified(self, n_accepted: int) -> None:
        """Nothing to do: the next propose() crops the cache to the committed context."""

    # -- the draft's cache -----------------------------------------------------------------

    def forward(self, ids: list[int]) -> torch.Tensor:
        """One forward of `ids` on the proposer's own cache: the last position's (1, V)."""
        t0 = time.perf_counter()
        cache = self._own.cache
        if self._head is not None:
            logits = head_logits(self._model, self._head, self._kwarg, ids, cache, self._device)
        else:
            logits = forward_logits(self._model, self._kwarg, ids, cache, self._device, 1)
        self.fed_tokens(ids, time.perf_counter() - t0)
        return logits

    def _sync(self, context: Sequence[int]) -> list[int]:
        """Crop the cache to the prefix shared with context[:-1]; return tokens to feed."""
        limit = min(len(self._fed), len(context) - 1)
        common = min(self._stable, limit)
        while common < limit and self._fed[common] == context[common]:
            common += 1
        if common < len(self._fed):
            self.kv.crop(common)
            del self._fed[common:]
        self._stable = len(context)
        return list(context[common:])
