"""Static draft trees: the shape a tree-drafting proposer follows, and the nodes it drafts.

A tree is a main chain (the proposer's ordinary chain of up to k tokens) with side branches:
the main chain's node at depth d (d = 0: the root, the last committed token) gets
`widths[d] - 1` more children beside the main chain's next token, each the start of a side
chain of at most `branch` tokens (never deeper than k). The side children of a node are its
draft's next most likely tokens when greedy (distinct, in order), and further independent
draws of the same distribution the main child was drawn from when sampling: what the tree
verifier's sampled rule needs (tree_verifier.py). A side chain continues as the main one
does (argmax, or a draw), and stops alike (EOS, low confidence, nothing allowed).

Nodes are numbered in drafting order (the main chain first, then each side chain), so a
node's parent always comes before it; `Proposal.parents` carries the parents (-1: the root).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gateway.engine.sampling import sample

DEFAULT_WIDTHS = (3, 2)  # top-3 at depth 1, top-2 at depth 2, then the chain
DEFAULT_BRANCH = 3


@dataclass(frozen=True)
class TreeShape:
    """widths[d]: children of the main chain's node at depth d (the main child included);
    branch: tokens of each side chain at most."""

    widths: tuple[int, ...] = DEFAULT_WIDTHS
    branch: int = DEFAULT_BRANCH

    def __post_init__(self) -> None:
        if any(w < 1 for w in self.widths) or self.branch < 1:
            raise ValueError(f"a tree shape needs widths and branch >= 1, got {self}")

    def sides(self, depth: int) -> int:
        """Side children beside the main child at `depth` (1: the root's children)."""
        return self.widths[depth - 1] - 1 if depth <= len(self.widths) else 0

    @classmethod
    def of(cls, widths: tuple[int, ...] | None) -> TreeShape | None:
        """A request's tree setting: None or () or all widths 1 means a chain."""
        if not widths or all(w == 1 for w in widths):
            return None
        return cls(tuple(widths))


@dataclass
class Side:
    """A side child not drafted on yet: its parent node, depth, token, the distribution it
    was drawn from, and where its parent's drafting stood (the proposer's own state)."""

    parent: int
    depth: int
    token: int
    q: torch.Tensor | None
    state: tuple[Any, ...]


@dataclass
class TreeNodes:
    """The nodes a proposal drafted: tokens, parents, and q rows ((1, V) each) when sampling."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)
    pending: list[Side] = field(default_factory=list)

    def add(self, token: int, parent: int, q: torch.Tensor | None) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        if q is not None:
            self.rows.append(q)
        return len(self.tokens) - 1


def side_tokens(
    z: torch.Tensor, token: int, count: int, q: torch.Tensor | None,
    generator: torch.Generator | None,
) -> list[int]:  # fmt: skip
    """`count` side tokens beside `token` from one position's shaped logits z (1, V): greedy
    (q None), the next most likely allowed tokens; sampling, `count` more draws of q (1, V)."""
    if count <= 0:
        return []
    if q is not None:
        return [int(sample(q, generator)) for _ in range(count)]
    top = torch.topk(z[0], min(count + 1, z.shape[-1]))
    out = [
        int(i) for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)
        if v != float("-inf") and int(i) != token
    ]  # fmt: skip
    return out[:count]
