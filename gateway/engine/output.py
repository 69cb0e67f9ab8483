"""Collects emitted tokens into text, logprobs and deltas; decides stop / length endings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gateway.engine.detok import IncrementalDetokenizer, TextOutput
from gateway.engine.schema import Delta, FinishReason, TokenLogprob


def token_logprobs(
    logprobs: torch.Tensor, tokens: list[int], top_n: int, token_str: Callable[[int], str]
) -> list[TokenLogprob]:
    """Per emitted token j: logprobs[j, tokens[j]] and the top_n of row j. logprobs (n, V)."""
    lp = logprobs.float().cpu()  # (n, V)
    chosen = lp[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()  # (n,)
    tops: list[tuple[tuple[int, str, float], ...]] = [() for _ in tokens]
    if top_n:
        values, ids = torch.topk(lp, top_n, dim=-1)  # (n, top_n)
        tops = [
            tuple((i, token_str(i), v) for i, v in zip(row_ids, row_vals, strict=True))
            for row_ids, row_vals in zip(ids.tolist(), values.tolist(), strict=True)
        ]
    return [
        TokenLogprob(t, token_str(t), c, top)
        for t, c, top in zip(tokens, chosen, tops, strict=True)
    ]


class OutputBuilder:
    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: tuple[int, ...],
        stop: tuple[str, ...],
        eos_token_ids: tuple[int, ...],
        max_tokens: int,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._text = TextOutput(stop)
        self._eos = frozenset(eos_token_ids)
        self._max_tokens = max_tokens
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.finish_reason: FinishReason | None = None
        self._sent_tokens = 0
        self._sent_logprobs = 0

    @property
    def text(self) -> str:
        return self._text.text

    def push(self, token: int) -> bool:
        """Commit one token; True when the output is finished (EOS, stop string, max_tokens)."""
        self.token_ids.append(token)
        if token in self._eos:
            self.finish_reason = "stop"
            return True
        self._text.add(self._detok.push(token))
        if self._text.stopped:
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self._max_tokens:
            self.finish_reason = "length"
        return self.finish_reason is not None

    def finish(self, reason: FinishReason) -> None:
        """End the output for `reason` unless already ended; releases held-back text."""
        if self.finish_reason is None:
            self.finish_reason = reason
        if not self._text.stopped:
            self._text.add(self._detok.flush())

    def delta(self) -> Delta | None:
        """What became final since the last delta, or None when nothing did."""
        done = self.finish_reason is not None
        text = self._text.release_all() if done else self._text.releasable()
        tokens = tuple(self.token_ids[self._sent_tokens :])
        lps = tuple(self.logprobs[self._sent_logprobs :])
        self._sent_tokens, self._sent_logprobs = len(self.token_ids), len(self.logprobs)
        if not text and not tokens:
            return None
        return Delta(text, tokens, lps)
