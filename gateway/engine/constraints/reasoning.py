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

gpt-oss thinks in harmony channels instead: an analysis message, then the answer in a
message of its own. `ChannelsFirst` is the same idea over that frame (its docstring).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from gateway.engine.constraints.base import Grammar

Entry = TypeVar("Entry", bound=tuple[Any, ...])


def _undo(
    log: list[Entry], n: int, inner: Grammar | None, fed: Callable[[Entry], int]
) -> Entry | None:
    """Drop the last ``n`` entries of a wrapper grammar's per-token log (each: its state
    before the token, and what it fed the inner grammar, read by ``fed``) and roll the inner
    grammar back by what they fed it; the first entry dropped (the state to return to), or
    None for n == 0."""
    if n < 0 or n > len(log):
        raise ValueError(f"cannot roll back {n} of {len(log)} tokens")
    if n == 0:
        return None
    undone = log[-n:]
    del log[-n:]
    back = sum(fed(entry) for entry in undone)
    if back and inner is not None:
        inner.rollback(back)
    return undone[0]


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
        first = _undo(self._log, n, self.inner, lambda entry: int(entry[2]))
        if first is not None:
            self.phase, self.thought, _ = first

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


# -- harmony channels (gpt-oss) ---------------------------------------------------------------

OPENING, FORCED = "opening", "forced"


@dataclass(frozen=True)
class Channels:
    """gpt-oss's harmony frame as token ids: the thinking is the analysis message
    ``<|channel|>analysis<|message|>…<|end|>``; the answer follows ``<|start|>assistant``.

    ``final``: the header of the answer's message (``<|channel|>final<|message|>``), written
    before an answer grammar that does not write its own (a response_format's); an inner
    grammar whose first token may be ``<|channel|>`` (the tool calls' own commentary header)
    writes its header itself."""

    analysis: tuple[int, ...]
    end: int
    start: tuple[int, ...]  # <|start|>assistant
    final: tuple[int, ...]  # <|channel|>final<|message|>
    channel: int  # <|channel|>


class ChannelsFirst:
    """A Grammar: an optional analysis message, free text up to its ``<|end|>`` (at most
    ``budget`` tokens), then ``inner`` in its own message.

    Phases: opening (the first tokens, either the analysis header or the answer's start:
    both may begin with ``<|channel|>``, so they are told apart token by token), think,
    forced (a fixed run of tokens: ``<|start|>assistant`` and the answer's header after the
    thinking, or the rest of the answer's header) and answer. The opening's tokens reach
    ``inner`` only once they turn out to be the answer's (its mask meanwhile is read with
    them consumed and rolled back). Each consumed token logs the state before it and how
    many tokens it handed to ``inner``, so `rollback` restores both exactly (speculation
    stays exact: the draft and the target are masked alike)."""

    def __init__(
        self, inner: Grammar | None, channels: Channels, budget: int | None = None
    ) -> None:
        self.inner = inner
        self.c = channels
        self.budget = budget
        self._prefix: tuple[int, ...] | None = None
        self.phase = OPENING
        self.opened: list[int] = []  # the opening's tokens
        self.analysis_live = True  # the opening still fits the analysis header
        self.answer_live = True  # ... still fits the answer
        self.forced: tuple[int, ...] = ()  # the forced phase's tokens
        self.pos = 0  # of which this many are written
        self.thought = 0
        self._log: list[tuple[Any, ...]] = []  # per token: the state before it, tokens fed

    @property
    def prefix(self) -> tuple[int, ...]:
        """The answer's header before the inner grammar: none where it writes its own (its
        first token may be ``<|channel|>``). Read on first use, on the thread that decodes."""
        if self._prefix is None:
            c, inner = self.c, self.inner
            own = inner is None or bool(inner.allowed_mask(c.channel + 1)[c.channel])
            self._prefix = () if own else c.final
        return self._prefix

    @property
    def after(self) -> tuple[int, ...]:
        """What the thinking's ``<|end|>`` forces before the inner grammar."""
        return () if self.inner is None else self.c.start + self.prefix

    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        c = self.c
        if self.phase == THINK:
            if self.budget is not None and self.thought >= self.budget:
                return _only(vocab_size, [c.end])
            return torch.ones(vocab_size, dtype=torch.bool)
        if self.phase == FORCED:
            return _only(vocab_size, [self.forced[self.pos]])
        if self.phase == ANSWER:
            return self._inner_mask(vocab_size)
        n = len(self.opened)
        mask = self._answer_mask(vocab_size) if self.answer_live else _only(vocab_size, [])
        if self.analysis_live and c.analysis[n] < vocab_size:
            mask[c.analysis[n]] = True
        return mask

    def _answer_mask(self, vocab_size: int) -> torch.Tensor:
        """What may follow the opening's tokens as the start of the answer."""
        n = len(self.opened)
        if n < len(self.prefix):
            return _only(vocab_size, [self.prefix[n]])
        if self.inner is None:
            return torch.ones(vocab_size, dtype=torch.bool)
        extra = self.opened[len(self.prefix) :]
        for t in extra:
            self.inner.consume(t)
        try:
            return self._inner_mask(vocab_size)
        finally:
            if extra:
                self.inner.rollback(len(extra))

    def _inner_mask(self, vocab_size: int) -> torch.Tensor:
        if self.inner is None:
            return torch.ones(vocab_size, dtype=torch.bool)
        return self.inner.allowed_mask(vocab_size).to(dtype=torch.bool).clone()

    def consume(self, token_id: int) -> None:
        state = (
            self.phase, len(self.opened), self.analysis_live, self.answer_live, self.forced,
            self.pos, self.thought,
        )  # fmt: skip
        fed = 0
        if self.phase == THINK:
            if token_id == self.c.end:
                self._force(self.after, 0)
            else:
                self.thought += 1
        elif self.phase == FORCED:
            self._force(self.forced, self.pos + 1)
        elif self.phase == ANSWER:
            fed = self._feed([token_id])
        else:
            fed = self._opening(token_id)
        self._log.append((*state, fed))

    def _opening(self, token_id: int) -> int:
        c, n = self.c, len(self.opened)
        fits_analysis = self.analysis_live and c.analysis[n] == token_id
        fits_answer = self.answer_live and bool(self._answer_mask(token_id + 1)[token_id])
        self.opened.append(token_id)
        self.analysis_live, self.answer_live = fits_analysis, fits_answer
        if fits_analysis and n + 1 == len(c.analysis):
            self.phase = THINK
        elif not fits_analysis:  # the answer, without thinking
            if n + 1 < len(self.prefix):
                self._force(self.prefix, n + 1)
            else:
                self.phase = ANSWER
                return self._feed(self.opened[len(self.prefix) :])
        return 0

    def _force(self, tokens: tuple[int, ...], pos: int) -> None:
        self.forced, self.pos = tokens, pos
        self.phase = FORCED if pos < len(tokens) else ANSWER

    def _feed(self, tokens: list[int]) -> int:
        if self.inner is None:
            return 0
        for t in tokens:
            self.inner.consume(t)
        return len(tokens)

    def rollback(self, n: int) -> None:
        first = _undo(self._log, n, self.inner, lambda entry: int(entry[-1]))
        if first is not None:
            (self.phase, opened, self.analysis_live, self.answer_live, self.forced, self.pos,
             self.thought, _) = first  # fmt: skip
            del self.opened[opened:]

    def is_complete(self) -> bool:
        if self.phase != ANSWER:
            return self.phase == OPENING and self.inner is None
        return self.inner is None or self.inner.is_complete()
