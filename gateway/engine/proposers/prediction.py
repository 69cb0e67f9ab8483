"""Prediction proposer (OpenAI "predicted outputs"): the client's guess of the output text.

The text is tokenized once. While the generated tokens follow it, the next k prediction
tokens are proposed; after a divergence nothing is proposed until the last few generated
tokens re-appear in the prediction (n-gram re-alignment, latest n first), then proposing
resumes from there.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from gateway.engine.proposers.base import Proposal


class PredictionProposer:
    name = "prediction"

    def shared_draft(self) -> None:
        """Model-free: the batch calls `propose` (base.py)."""
        return None

    def __init__(self, prediction_ids: Sequence[int], prompt_len: int, realign_ngram: int = 3):
        self._pred = list(prediction_ids)
        self._prompt_len = prompt_len
        self._ngram = realign_ngram
        self._pos: int | None = 0  # prediction index of the next expected token; None = lost
        self._last_pos = 0  # furthest aligned position, to prefer re-aligning forward
        self._seen = prompt_len  # context tokens already matched against the prediction
        # n-gram -> prediction positions right after its occurrences (something must follow)
        self._ends: dict[tuple[int, ...], list[int]] = {}
        for n in range(1, realign_ngram + 1):
            for j in range(n, len(self._pred)):
                self._ends.setdefault(tuple(self._pred[j - n : j]), []).append(j)

    def _advance(self, ctx: Sequence[int]) -> None:
        for t in ctx[self._seen :]:
            if self._pos is not None and self._pos < len(self._pred) and self._pred[self._pos] == t:
                self._pos += 1
                self._last_pos = self._pos
            else:
                self._pos = None
        self._seen = len(ctx)

    def _realign(self, ctx: Sequence[int]) -> int | None:
        """Longest suffix (<= realign_ngram) of the output found in the prediction: the
        first occurrence at or after the furthest aligned point, else the last one."""
        generated = ctx[self._prompt_len :]
        for n in range(min(self._ngram, len(generated)), 0, -1):
            ends = self._ends.get(tuple(generated[-n:]))
            if ends:
                i = bisect.bisect_left(ends, self._last_pos)
                return ends[i] if i < len(ends) else ends[-1]
        return None

    def propose(self, context_ids: Sequence[int], k: int) -> Proposal:
        self._advance(context_ids)
        if self._pos is None:
            self._pos = self._realign(context_ids)
            if self._pos is None:
                return Proposal([])
        return Proposal(self._pred[self._pos : self._pos + k])

    def on_verified(self, n_accepted: int) -> None:
        """Alignment is re-derived from the committed context in the next propose()."""
