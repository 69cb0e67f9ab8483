"""A tree step's planning and verdict (loop.py calls these for a proposal with parents).

Planning walks the grammar along every branch: each node's token is checked against the
mask at its parent (the grammar moved there by rolling back to the common prefix of the
last branch and consuming the rest), and each node gets the mask at its own state for the
target's distribution there. What is dropped, and why it stays exact (tree_verifier.py):

- below EOS or a forbidden token: nothing (that node is never continued from);
- a forbidden node itself: greedy, dropped (the target's argmax is allowed, so it would
  never be accepted); sampled, kept as a leaf with its parent's mask, so that its rejection
  (certain: p is 0 there) still takes its q out of the residual, as the rule requires;
- nodes past the room left in the row's context, or past MAX_K nodes (a step's feed is at
  most 1 + MAX_K tokens, what the slots' padding holds), by index, never by value.

The grammar ends where it started (no tokens consumed): the verdict's path is consumed as
it is emitted (loop.settle_step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from gateway.engine.constraints.base import next_token_mask
from gateway.engine.proposers.base import Proposal
from gateway.engine.sampling import LogitsShaper, argmax_rows
from gateway.engine.tree_verifier import TreeVerdict, verify_tree_greedy, verify_tree_sampled
from gateway.limits import MAX_K

if TYPE_CHECKING:
    from gateway.engine.loop import LoopConfig


def _path(parents: Sequence[int], node: int) -> list[int]:
    """Node indices from the root's child down to `node` (empty for the root, -1)."""
    out: list[int] = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def tree_plan(
    cfg: LoopConfig, proposal: Proposal
) -> tuple[list[int], list[int], torch.Tensor | None, torch.Tensor | None]:
    """The tree's (tokens, parents, q rows (n, V) or None, masks (n + 1, V) or None) as fed."""
    assert proposal.parents is not None
    tokens, parents = proposal.tokens, proposal.parents
    eos = frozenset(cfg.target.eos_token_ids)
    greedy = cfg.shaper.greedy
    room = cfg.target.context_length - len(cfg.prompt_ids) - len(cfg.output.token_ids)
    cap = min(room - 1, MAX_K)
    g = cfg.grammar
    vocab, dev = cfg.target.vocab_size, cfg.target.device

    def mask() -> torch.Tensor:
        assert g is not None
        return next_token_mask(g, vocab, cfg.target.eos_token_ids, dev)  # (V,)

    new: dict[int, int] = {}  # kept node -> its index as fed
    leaf: set[int] = set()  # kept nodes nothing hangs from (EOS, forbidden)
    masks = [mask()] if g is not None else []
    at: list[int] = []  # the nodes the grammar has consumed, root down
    try:
        for i, (tok, par) in enumerate(zip(tokens, parents, strict=True)):
            if len(new) >= cap:
                break
            if par >= 0 and (par not in new or par in leaf):
                continue
            row = 0 if par < 0 else new[par] + 1
            allowed = g is None or bool(masks[row][tok])
            if not allowed and greedy:
                continue
            new[i] = len(new)
            if not allowed or tok in eos:
                leaf.add(i)
                if g is not None:
                    masks.append(masks[row])
                continue
            if g is not None:
                want = _path(parents, i)
                common = 0
                while common < min(len(at), len(want)) and at[common] == want[common]:
                    common += 1
                if len(at) > common:
                    g.rollback(len(at) - common)
                for node in want[common:]:
                    g.consume(tokens[node])
                at = want
                masks.append(mask())
    finally:
        if g is not None and at:
            g.rollback(len(at))
    kept = list(new)
    out_parents = [-1 if parents[i] < 0 else new[parents[i]] for i in kept]
    q = None
    if proposal.probs is not None:
        q = proposal.probs[torch.tensor(kept, dtype=torch.long)] if kept else proposal.probs[:0]
    return [tokens[i] for i in kept], out_parents, q, torch.stack(masks) if masks else None


def tree_verdict(
    shaper: LogitsShaper, z: torch.Tensor, tokens: list[int], parents: list[int],
    q: torch.Tensor | None, generator: torch.Generator | None,
) -> tuple[TreeVerdict, torch.Tensor | None]:  # fmt: skip
    """The verdict on a tree from its shaped logits z (n + 1, V), and the target's
    probabilities (None when greedy)."""
    if shaper.greedy:
        return verify_tree_greedy(tokens, parents, argmax_rows(z)), None
    p = shaper.probs(z)  # (n + 1, V)
    if q is None:
        if any(parents.count(par) > 1 for par in set(parents)):
            raise ValueError("a sampled tree needs the draft's distributions")
        q = torch.zeros(len(tokens), p.shape[-1], dtype=p.dtype, device=p.device)
        q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return verify_tree_sampled(tokens, parents, q.to(p.device, p.dtype), p, generator), p
