"""Thinking before a constrained answer: a Grammar (base.py) that leaves a reasoning model's
thinking free and hands what follows it to another grammar.

Reasoning models (Qwen3, DeepSeek-R1 distills and others) write `<think>…</think>` before
their answer. A response_format schema or a forced tool call constrains the answer; applied
from the first token it would forbid the thinking the model was trained to do. This grammar
runs in four phases over token ids (the markers must each be one token of the vocabulary, as
they are in those models' tokenizers):

- open: the first token; either the start marker (thinking begins) or the answer's first
  token (the model answers without thinking). Skipped when the prompt already opened the
  thinking (templates that end the generation prompt with the start marker).
- think: any token (EOS is refused by the loop: the grammar is not complete) until the end
  marker; after `budget` thinking tokens only the end marker is allowed (a reasoning cap).
- gap: whitespace tokens between the end marker and the answer.
- answer: the inner grammar (None: anything).

Every consumed token is logged with the phase it was consumed in, so `rollback(n)` restores
the phase, the thinking count and the inner grammar (rolled back by the tokens it consumed)
exactly: speculation stays exact (the draft and the target are masked alike).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gateway.engine.constraints.base import Grammar

OPEN, THINK, GAP, ANSWER = "open", "think", "gap", "answer"


@dataclass(frozen=True)
class Markers:
    """The thinking's token ids: start (None: the model has no start token of its own),
    end, and the whitespace tokens allowed between the end and the answer."""

    start: int | None
    end: int
    whitespace: frozenset[int] = frozenset()


class ThinkingFirst:
    """A Grammar: free thinking, then `inner` (see the module docstring)."""

    def __init__(
        self, inner: Grammar | None, markers: Markers, inside: bool, budget: int | None = None
    ) -> None:
        self.inner = inner
        self.markers = markers
        self.budget = budget
        self.phase = THINK if inside or markers.start is None else OPEN
        self.thought = 0  # thinking tokens so far (markers excluded)
        # per consumed token: the phase and thinking count before it, whether inner took it
        self._log: list[tuple[str, int, bool]] = []

    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        m = self.markers
        if self.phase == THINK:
            if self.budget is not None and self.thought >= self.budget:
                return _only(vocab_size, [m.end])
            return torch.ones(vocab_size, dtype=torch.bool)
        mask = self._answer_mask(vocab_size)
        if self.phase == OPEN and m.start is not None and m.start < vocab_size:
            mask[m.start] = True
        if self.phase == GAP:
            ids = [i for i in m.whitespace if i < vocab_size]
            if ids:
                mask[torch.tensor(ids)] = True
        return mask

    def _answer_mask(self, vocab_size: int) -> torch.Tensor:
        if self.inner is None:
            return torch.ones(vocab_size, dtype=torch.bool)
        return self.inner.allowed_mask(vocab_size).to(dtype=torch.bool).clone()

    def consume(self, token_id: int) -> None:
        m, phase, thought = self.markers, self.phase, self.thought
        to_inner = False
        if phase == OPEN and token_id == m.start:
            self.phase = THINK
        elif phase == THINK:
            if token_id == m.end:
                self.phase = GAP
            else:
                self.thought += 1
        elif phase == GAP and token_id in m.whitespace:
            pass
        else:  # the answer's token (its first one from open or gap)
            self.phase = ANSWER
            to_inner = self.inner is not None
            if self.inner is not None:
                self.inner.consume(token_id)
        self._log.append((phase, thought, to_inner))

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._log):
            raise ValueError(f"cannot roll back {n} of {len(self._log)} tokens")
        if n == 0:
            return
        undone = self._log[-n:]
        del self._log[-n:]
        inner = sum(1 for _, _, to_inner in undone if to_inner)
        if inner and self.inner is not None:
            self.inner.rollback(inner)
        self.phase, self.thought, _ = undone[0]

    def is_complete(self) -> bool:
        if self.phase == THINK:
            return False
        if self.phase == OPEN and self.inner is None:
            return True
        return self.inner is None or self.inner.is_complete()


def _only(vocab_size: int, ids: list[int]) -> torch.Tensor:
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[torch.tensor([i for i in ids if i < vocab_size], dtype=torch.long)] = True
    return mask
