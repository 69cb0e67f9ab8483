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
        self._native = native_decode(tokenizer)
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
        if self._native is not None:
            return str(self._native(ids, skip_special_tokens=True))
        return str(self._tok.decode(ids, skip_special_tokens=True))


def native_decode(tokenizer: Any) -> Any:
    """The `tokenizers` library's own decode under a transformers fast tokenizer whose
    `decode` adds nothing to it (its `_decode` not overridden, no clean-up of spaces), else
    None. transformers' `decode` converts its arguments and dispatches on every call, which
    costs more than the decode itself for the two-token windows pushed per token."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers version: its decode is used
        return None
    if not isinstance(tokenizer, TokenizersBackend):
        return None
    if type(tokenizer)._decode is not TokenizersBackend._decode:
        return None
    if getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    backend: Any = tokenizer.backend_tokenizer
    return backend.decode


class _StopMatcher:
    """Knuth-Morris-Pratt over one stop string, fed one character at a time: ``state`` is
    the length of the longest prefix of the stop string that the text fed so far ends with
    (the stop string is found when it reaches its length). Amortized O(1) per character."""

    __slots__ = ("fail", "state", "stop")

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.state = 0
        fail = [0] * len(stop)  # fail[i]: longest proper border of stop[: i + 1]
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            fail[i] = k
        self.fail = fail

    def feed(self, ch: str) -> bool:
        """Advance by one character; True when the text now ends with the stop string."""
        stop, st = self.stop, self.state
        while st and stop[st] != ch:
            st = self.fail[st - 1]
        if stop[st] == ch:
            st += 1
        if st == len(stop):
            self.state = self.fail[st - 1]
            return True
        self.state = st
        return False


class TextOutput:
    """Accumulates decoded text, finds stop strings, and decides what may be streamed.

    Linear in the output: each new character advances one KMP matcher per stop string
    (amortized O(1) each), the held-back tail is read off the matchers' states, released
    text is kept as pieces (joined when `text` is read) and only the unreleased tail (at
    most the longest stop string plus the newest piece) is ever copied. The output ends
    before the first stop string to complete (the longest one when several complete at the
    same character), whatever the token boundaries."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._matchers = [_StopMatcher(s) for s in stop if s]
        self._released: list[str] = []  # text already released, in pieces
        self._streamed = 0  # characters released
        self._tail = ""  # text not released yet
        self.stopped = False

    @property
    def text(self) -> str:
        """All text so far (truncated before the stop string once stopped)."""
        if len(self._released) > 1:
            self._released = ["".join(self._released)]
        return (self._released[0] if self._released else "") + self._tail

    def add(self, new_text: str) -> None:
        """Append text; if a stop string appears, cut the text before it and stop."""
        if self.stopped or not new_text:
            return
        if self._matchers:
            base = self._streamed + len(self._tail)  # characters before new_text
            for i, ch in enumerate(new_text):
                cut = -1
                for m in self._matchers:
                    if m.feed(ch):
                        start = base + i + 1 - len(m.stop)
                        cut = start if cut < 0 else min(cut, start)
                if cut >= 0:  # never inside released text: that part was held back
                    self._tail = (self._tail + new_text[: i + 1])[: cut - self._streamed]
                    self.stopped = True
                    return
        self._tail += new_text

    def releasable(self) -> str:
        """Text safe to stream now: excludes a tail that is a prefix of some stop string."""
        n = len(self._tail) if self.stopped else len(self._tail) - self._held_tail()
        return self._release(max(0, n))

    def release_all(self) -> str:
        return self._release(len(self._tail))

    def _release(self, n: int) -> str:
        out, self._tail = self._tail[:n], self._tail[n:]
        if out:
            self._released.append(out)
            self._streamed += len(out)
        return out

    def _held_tail(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        return max((m.state for m in self._matchers), default=0)
