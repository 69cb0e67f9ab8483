"""Feature-conditioned draft head proposer (EAGLE-3 style): drafts a chain of k tokens with
one decoder layer over the target's own hidden states (gateway/feature_head.py).

The target hands back its hidden states at the head's taps for every position it commits
(the prefill's, and each verify forward's first m + 1, m accepted: batch/forward.py
`FeatureTap`; the loop and the batch call `on_features`). Head position j reads the fused
features g_j and the token after it, ctx[j + 1], so the head's own KV cache holds the
committed positions up to len(ctx) - 2, the target's cache's positions. A proposal:

1. feed the committed positions the head has not seen yet (usually m + 1 of them) into its
   cache, after dropping the draft positions of the last proposal (a length counter);
2. chain: from the last output o, logits through the target's output head (or a reduced
   vocabulary) -> one token (this row's shaper, grammar and generator, as a draft model's
   proposer does); then the head at the next position reads (o, that token); k times or
   until EOS, low confidence or nothing allowed.

With a tree shape (proposers/tree.py), the main chain's side children are drafted after it:
the head's cache length goes back to their parent's, and each side chain is stepped from
the parent's output, overwriting the positions the last chain used.

Whatever it proposes, the verifier keeps the output exact; a gap in the features (a prompt
prefix reused from another request's slot, whose positions the target did not compute)
only restarts the head's context at the first position it has features for.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from gateway.engine.constraints.base import Grammar, next_token_mask
from gateway.engine.models import LoadedModel
from gateway.engine.proposers.base import Proposal, Proposer
from gateway.engine.proposers.tree import Side, TreeNodes, TreeShape, side_tokens
from gateway.engine.sampling import LogitsShaper, argmax_rows, sample
from gateway.feature_head import FeatureHead, HeadCache, load_head


def feature_layers(p: Proposer | None) -> tuple[int, ...] | None:
    """The target hidden states a proposer reads (FeatureTap layers), or None: none (the
    target's forwards then compute no hidden states for it)."""
    layers = getattr(p, "feature_layers", None)
    return tuple(layers) if layers else None


def is_head(lm: LoadedModel | None) -> bool:
    """Whether a draft LoadedModel is a feature head (load_head_model), not a draft LM."""
    return lm is not None and isinstance(lm.model, FeatureHead)


def load_head_model(path: str, target: LoadedModel, reduced: bool = True) -> LoadedModel:
    """A head directory loaded on `target`'s embeddings and output head, described as a
    draft LoadedModel (its `model` the FeatureHead; tokenizer, vocabulary and context the
    target's), so that a registry, rollout and request pass it as they pass a draft."""
    m = target.model
    head = load_head(
        path, m.get_input_embeddings().weight, m.get_output_embeddings().weight, reduced
    )
    if head.cfg.target_layers != int(m.config.num_hidden_layers):
        raise ValueError(
            f"{path}: the head reads a target of {head.cfg.target_layers} layers, "
            f"this target has {m.config.num_hidden_layers}"
        )
    return LoadedModel(
        model=head, tokenizer=target.tokenizer, device=target.device, dtype=target.dtype,
        path=str(path), vocab_size=target.vocab_size, context_length=target.context_length,
        eos_token_ids=target.eos_token_ids,
    )  # fmt: skip


class HeadProposer:
    """One request's head drafting (see the module doc)."""

    name = "head"

    def __init__(
        self,
        head: FeatureHead,
        shaper: LogitsShaper,
        generator: torch.Generator | None,
        grammar: Grammar | None,
        eos_token_ids: tuple[int, ...],
        capacity: int,
        min_confidence: float = 0.0,
    ) -> None:
        self.head = head
        self.tree: TreeShape | None = None  # drafts trees of this shape (set by its builder)
        self.tree_on = True  # off: the next proposal drafts a chain (batch/tree_choice.py)
        self._shape: TreeShape | None = None  # this proposal's tree shape
        self.feature_layers = head.cfg.taps
        self._shaper = shaper
        self._gen = generator
        self._grammar = grammar
        self._eos_ids = eos_token_ids
        self._eos = frozenset(eos_token_ids)
        self._min_conf = min_confidence
        self._vocab = head.cfg.vocab
        self._device = head.fc.weight.device
        self._cache = HeadCache(head, capacity)
        self._feats: list[torch.Tensor] = []  # per position from self._f0, (taps x H,)
        self._f0 = 0
        self._real = 0  # cache entries from target features: positions f0 .. f0 + real - 1
        self._last: torch.Tensor | None = None  # the head's output at its last real position
        self._consumed = 0  # tokens this proposal consumed into the grammar
        self.forwards = 0
        self.forward_s = 0.0

    def shared_draft(self) -> None:
        """A batch asks it to `propose` (its cache is its own, base.py)."""
        return None

    def on_features(self, start: int, feats: torch.Tensor) -> None:
        """The target's features (t, taps x H) of committed positions start .. start + t - 1."""
        end = self._f0 + len(self._feats)
        if not self._feats or start < self._f0 or start > end:  # a gap: start over there
            self._feats, self._f0, self._real, self._last = [], start, 0, None
        else:
            del self._feats[start - self._f0 :]
            if self._real > len(self._feats):
                self._real, self._last = len(self._feats), None
        self._feats.extend(feats.detach().to(self._device, self.head.fc.weight.dtype).unbind(0))

    def on_verified(self, n_accepted: int) -> None:
        """Nothing to do: the next proposal drops the draft positions (features come in
        `on_features`)."""

    def propose(self, context_ids: Sequence[int], k: int) -> Proposal:
        t0 = time.perf_counter()
        try:
            return self._propose(context_ids, k)
        finally:
            self.forward_s += time.perf_counter() - t0

    def _propose(self, ctx: Sequence[int], k: int) -> Proposal:
        head, cache = self.head, self._cache
        cache.length = self._real  # 1. drop the last proposal's draft positions
        last = min(self._f0 + len(self._feats), len(ctx) - 1)  # feed positions < last
        new = range(self._f0 + self._real, last)
        if len(new):
            if cache.length + len(new) + k + 1 > cache.k.shape[2]:
                return Proposal([])
            g = head.fuse(torch.stack(self._feats[self._real : last - self._f0]))  # (t, H)
            o = cache.step(head, g, [ctx[j + 1] for j in new], new.start)  # (t, H)
            self.forwards += 1
            self._real = last - self._f0
            self._last = o[-1]
        if self._last is None or k <= 0 or cache.length + k + 1 > cache.k.shape[2]:
            return Proposal([])
        if last != len(ctx) - 1:  # features short of the committed context: no guess
            return Proposal([])
        nodes = TreeNodes()
        self._consumed = 0
        self._shape = self.tree if self.tree_on else None
        try:  # 2. the chain (and, with a tree shape, the side chains)
            self._chain(nodes, self._last, last, -1, 1, k, True)
            while self._shape is not None and nodes.pending:
                side = nodes.pending.pop(0)
                o, pos, length, at = side.state
                cache.length = length
                self._rollback_to(at)
                node = nodes.add(side.token, side.parent, side.q)
                limit = min(k, side.depth + self._shape.branch - 1)
                if side.token in self._eos or side.depth >= limit:
                    continue
                self._consume(side.token)
                o = cache.step(head, o[None], [side.token], pos)[0]  # (H,)
                self.forwards += 1
                self._chain(nodes, o, pos + 1, node, side.depth + 1, limit, False)
        finally:
            self._rollback_to(0)
        probs = torch.cat(nodes.rows) if nodes.rows else None
        return Proposal(nodes.tokens, probs, None if self._shape is None else nodes.parents)

    def _chain(
        self, nodes: TreeNodes, o: torch.Tensor, pos: int, at: int, depth: int, limit: int,
        main: bool,
    ) -> None:  # fmt: skip
        """Draft a chain from the head's output o (H,) at position pos, hanging from node
        `at` at `depth`, to depth `limit` at most; on the main chain of a tree, note each
        node's side children (with the head's and the grammar's state there)."""
        head, cache = self.head, self._cache
        while True:
            z = head.full_logits(o[None])  # (1, V)
            pick = self._pick(z)
            if pick is None:
                return
            tok, q, conf, shaped = pick
            node = nodes.add(tok, at, q)
            if main and self._shape is not None:
                state = (o, pos, cache.length, self._consumed)
                for side in side_tokens(shaped, tok, self._shape.sides(depth), q, self._gen):
                    nodes.pending.append(Side(at, depth, side, q, state))
            if tok in self._eos or conf < self._min_conf or depth >= limit:
                return
            self._consume(tok)
            o = cache.step(head, o[None], [tok], pos)[0]  # (H,)
            self.forwards += 1
            pos, at, depth = pos + 1, node, depth + 1

    def _consume(self, tok: int) -> None:
        if self._grammar is not None:
            self._grammar.consume(tok)
            self._consumed += 1

    def _rollback_to(self, consumed: int) -> None:
        """The grammar back to `consumed` tokens of this proposal."""
        if self._grammar is not None and self._consumed > consumed:
            self._grammar.rollback(self._consumed - consumed)
        self._consumed = min(self._consumed, consumed)

    def _pick(
        self, logits: torch.Tensor
    ) -> tuple[int, torch.Tensor | None, float, torch.Tensor] | None:
        """One token from the head's logits (1, V), shaped and masked as the target's will
        be: (token, its distribution row or None when greedy, its confidence, the shaped
        logits), or None when nothing allowed is left."""
        mask = None
        if self._grammar is not None:
            mask = next_token_mask(self._grammar, self._vocab, self._eos_ids, self._device)
        z = self._shaper.shape(logits, None if mask is None else mask[None])  # (1, V)
        if not bool(torch.isfinite(z).any()):
            return None  # the reduced vocabulary, a token list or the grammar leave nothing
        if self._shaper.greedy:
            tok = argmax_rows(z)[0]
            conf = float(torch.softmax(z[0], dim=-1)[tok]) if self._min_conf > 0 else 1.0
            return tok, None, conf, z
        q = self._shaper.probs(z)  # (1, V)
        tok = int(sample(q, self._gen))
        return tok, q, float(q[0, tok]), z
