"""Incremental detokenization with stop strings.

Byte-level BPE tokens can end in the middle of a UTF-8 character; decoding such a prefix
yields U+FFFD, so text ending in U+FFFD is held back until the character completes. Text
that could still become a stop string is held back too; a stop string ends the output
before its first character, wherever the token boundaries (or verify steps) fall.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """vLLM-style: decode a short window of tokens, emit only the newly completed text.

    prefix_offset..read_offset is the window already emitted (decoded for context, so
    tokenizers that strip a leading space per decode call still join correctly).
    """

    def __init__(self, tokenizer: Any, context_ids: tuple[int, ...] = ()) -> None:
        self._tok = tokenizer
        self._ids: list[int] = list(context_ids[-6:])
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token, return text that is now final (possibly '')."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT):
            new = full_text[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self._ids)
            return new
        return ""

    def flush(self) -> str:
        """Whatever is still held back (incomplete characters decode to U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return str(self._tok.decode(ids, skip_special_tokens=True))


class TextOutput:
    """Accumulates decoded text, finds stop strings, and decides what may be streamed."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._stop = tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self._stop), default=0)
        self.text = ""  # all text so far (truncated before the stop string once stopped)
        self._streamed = 0  # characters of self.text already released
        self.stopped = False

    def add(self, new_text: str) -> None:
        """Append text; if a stop string appears, cut the text before it and stop."""
        if self.stopped or not new_text:
            return
        start = max(0, len(self.text) - self._max_stop + 1)
        self.text += new_text
        hits = [i for s in self._stop if (i := self.text.find(s, start)) >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def releasable(self) -> str:
        """Text safe to stream now: excludes a tail that is a prefix of some stop string."""
        end = len(self.text)
        if not self.stopped:
            end -= self._held_tail()
        out = self.text[self._streamed : end]
        self._streamed = max(self._streamed, end)
        return out

    def release_all(self) -> str:
        out = self.text[self._streamed :]
        self._streamed = len(self.text)
        return out

    def _held_tail(self) -> int:
        for n in range(min(self._max_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self._stop):
                return n
        return 0
