"""The Proposer protocol: two verbs, propose k tokens, then learn how many were accepted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from gateway.engine.proposers.draft_model import DraftModelProposer


@dataclass(frozen=True)
class Proposal:
    """tokens: the drafted ids (at most k, possibly none); probs: (len(tokens), V) warped and
    masked draft distribution each token was sampled from, or None meaning one-hot;
    parents: None for a chain, else a tree (tree_verifier.py): each token's parent, an
    earlier index or -1 for the root (the last committed token)."""

    tokens: list[int]
    probs: torch.Tensor | None = None
    parents: list[int] | None = None


class Proposer(Protocol):
    name: str

    def propose(self, context_ids: Sequence[int], k: int) -> Proposal:
        """Draft up to k tokens continuing context_ids (prompt + committed output)."""
        ...

    def on_verified(self, n_accepted: int) -> None:
        """How many of the last proposal's tokens the verifier kept."""
        ...

    def shared_draft(self) -> DraftModelProposer | None:
        """How a continuous batch drafts for it: as a draft model's proposer, whose forwards
        the batch runs for all the rows drafting with that model together (one shared set
        of draft slots per model, batch/drafting.py); None: the batch calls `propose`."""
        ...


class ModelProposer(Proposer, Protocol):
    """A proposer that runs a model; its forward count and time feed the stats and c."""

    forwards: int
    forward_s: float
