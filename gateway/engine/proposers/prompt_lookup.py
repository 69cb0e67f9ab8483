"""Prompt lookup: copy what followed the latest earlier occurrence of the context's suffix.

State lives in the proposer object, which is built per request: nothing is shared across
requests (a shared n-gram cache would leak content and timing between users).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.engine.proposers.base import Proposal


class PromptLookupProposer:
    """For n = max_ngram .. min_ngram: if the last n tokens occurred before, propose the
    (up to k) tokens that followed their most recent earlier occurrence; one-hot q."""

    name = "prompt_lookup"

    def shared_draft(self) -> None:
        """Model-free: the batch calls `propose` (base.py)."""
        return None

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self._sizes = range(max_ngram, min_ngram - 1, -1)
        # _index[n][ngram] = position right after the most recent indexed occurrence
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self._sizes}
        self._indexed = 0  # continuation positions < _indexed are in the index

    def _extend_index(self, ctx: Sequence[int]) -> None:
        for i in range(max(self._indexed, 1), len(ctx)):
            for n in self._sizes:
                if i - n >= 0:
                    self._index[n][tuple(ctx[i - n : i])] = i
        self._indexed = max(self._indexed, len(ctx))

    def propose(self, context_ids: Sequence[int], k: int) -> Proposal:
        self._extend_index(context_ids)
        for n in self._sizes:
            if n > len(context_ids):
                continue
            pos = self._index[n].get(tuple(context_ids[-n:]))
            if pos is not None:
                return Proposal(list(context_ids[pos : pos + k]))
        return Proposal([])

    def on_verified(self, n_accepted: int) -> None:
        """Stateless beyond the context index: rejected tokens never enter the context."""
