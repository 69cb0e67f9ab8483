"""Verification of a drafted token tree against the target. Pure functions over tensors.

A tree step drafts n nodes below the root (the last committed token). Node i has a token
`tokens[i]` and a parent `parents[i]` (-1: the root; otherwise an earlier node, parents[i]
< i, so the nodes are in topological order: depth-first, breadth-first or any other). One
target forward over [root, node 0, ..., node n-1], each node attending to the committed
context and to its ancestors only (batch/masks.py), yields n + 1 target distributions:
row 0 (the root's) is p of the token after the committed context, row i + 1 is p of the
token after the path root -> ... -> node i. A chain is the tree parents = [-1, 0, 1, ...].

- accepted: a root-to-node path the verifier keeps (its node indices, in depth order).
- token: the token emitted after it (recovered or bonus), from the target at its end.

Greedy: from the root, descend into the child whose token equals argmax p at the current
node, while there is one; then emit that argmax. That is the longest path whose every token
is the target's argmax at its parent (children of a node carry distinct tokens in a greedy
tree; with duplicates the first one in index order is taken, which gives the same tokens).

Sampled: recursive rejection sampling over a node's children (SpecInfer's multi-step
speculative sampling, SpecTr's k-sequential rule with i.i.d. drafts). The rule assumes
the children c_1..c_k of a node u (in index order) carry tokens x_1..x_k drawn
**independently from the same draft distribution q_u** (given the path to u), and that
everything below each child was drafted given that child's path; `q[c]` is the row each
child was drawn from. At node u, with r = p_u:

    for i = 1..k:  with probability min(1, r(x_i) / q_u(x_i)) accept c_i and go on at c_i
                   (r := p_{c_i}); otherwise r := normalize(max(0, r - q_u))
    no child accepted: emit a sample of r and stop.

Claim: at every node the emitted token (the accepted child's token, or the final sample)
is distributed exactly as r_0 = p_u. Proof, by induction on k for an arbitrary target r:
k = 0 emits a sample of r. For k >= 1, the first candidate x_1 ~ q is emitted with
probability q(x) min(1, r(x)/q(x)) = min(r(x), q(x)) for token x, and rejected with
probability beta = 1 - sum_y min(r(y), q(y)) = sum_y max(0, r(y) - q(y)). On rejection the
rule runs the same procedure on r' = max(0, r - q) / beta with the remaining k - 1
candidates, which are independent of x_1 and of its uniform, so given the rejection they
are still k - 1 i.i.d. draws of q and, by induction, the procedure emits exactly r'. So
    P(x) = min(r(x), q(x)) + beta * max(0, r(x) - q(x)) / beta = r(x).
(beta = 0 means r = q, where rejection has probability 0.) Having emitted a child's token
x, the rule continues at that child with the target's distribution after x and the
child's own children, which were drawn given the path to it: by the same claim the next
token follows p after x, and so on down the path; each emitted token follows the target
given all emitted before it, so the whole emission is a sample of the target. The tree's
shape may depend on a node's own token and its ancestors (a draft stops after EOS or a
low-confidence token), and how many candidates u has after c_i may depend on c_1..c_i and
everything drafted below them (the induction step holds for any number of remaining
candidates, as long as they are independent draws of q), but never on the remaining
candidates' own tokens: dropping a candidate because of its value would leave the others
drawn from q restricted, not q (why tree_step.py keeps a forbidden child as a leaf
instead of cutting it, and cuts a tree to the room left by index only: a node comes after
its parent and its earlier siblings, so whether a candidate is kept depends on nodes
numbered before it: its ancestors, earlier candidates and what hangs below them, and
other branches, which are independent draws; never on a later candidate).

A proposer without probabilities (one-hot q) can only draft chains for sampled requests:
distinct one-hot siblings are not i.i.d. draws of anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gateway.engine.verifier import residual


@dataclass(frozen=True)
class TreeVerdict:
    """path: the accepted nodes from the root down (indices into the tree's nodes);
    token: the recovered or bonus token emitted after them."""

    path: list[int]
    token: int

    @property
    def accepted(self) -> int:
        return len(self.path)


def children_of(parents: Sequence[int]) -> list[list[int]]:
    """Each feed row's children (row 0 the root, row i + 1 node i), in index order."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, par in enumerate(parents):
        if not -1 <= par < i:
            raise ValueError(f"node {i}'s parent {par} is not an earlier node or the root")
        kids[par + 1].append(i)
    return kids


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth (a child of the root has depth 1)."""
    out: list[int] = []
    for par in parents:
        out.append(1 if par < 0 else out[par] + 1)
    return out


def path_rows(path: Sequence[int]) -> list[int]:
    """The feed rows of the root and an accepted path: [0, path[0] + 1, ...]."""
    return [0, *(a + 1 for a in path)]


def verify_tree_greedy(
    tokens: Sequence[int], parents: Sequence[int], target_argmax: Sequence[int]
) -> TreeVerdict:
    """target_argmax: argmax p per feed row (n + 1 entries, row 0 the root's)."""
    kids = children_of(parents)
    path: list[int] = []
    row = 0
    while True:
        want = target_argmax[row]
        nxt = next((c for c in kids[row] if tokens[c] == want), None)
        if nxt is None:
            return TreeVerdict(path, int(want))
        path.append(nxt)
        row = nxt + 1


Residual = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def verify_tree_sampled(
    tokens: Sequence[int],
    parents: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
    residual_of: Residual = residual,
) -> TreeVerdict:
    """Recursive rejection sampling (module doc). draft_probs (n, V): the distribution each
    node was drawn from (siblings' rows equal); target_probs (n + 1, V), row 0 the root's.
    `residual_of` is the rule's residual (a test swaps in a wrong one: it must be caught)."""
    kids = children_of(parents)
    path: list[int] = []
    row = 0
    r = target_probs[0]  # (V,)
    while True:
        accepted = None
        for c in kids[row]:
            x, q = tokens[c], draft_probs[c]  # (V,)
            u = torch.rand((), generator=generator, device=r.device)
            if float(u * q[x]) < float(r[x]):  # u < min(1, r(x)/q(x)); q(x) > 0
                accepted = c
                break
            r = residual_of(r, q)  # (V,)
        if accepted is None:
            token = torch.multinomial(r, 1, generator=generator)  # (1,)
            return TreeVerdict(path, int(token))
        path.append(accepted)
        row = accepted + 1
        r = target_probs[row]
