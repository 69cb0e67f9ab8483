"""Special tokens written back into an output's text, where reading the output needs them.

The engine decodes an output without its special tokens, as clients expect. Some models
structure their output with special tokens only: gpt-oss's harmony channels
(``<|channel|>analysis<|message|>…<|end|>``) and Mistral v11's tool calls
(``[TOOL_CALLS]f[ARGS]{…}``) decode to text that no longer tells thinking from answer or a
call from prose. For those requests the serving layer reads a text with the structural
tokens written in at their places (`ShownText`), and the readers (serving/reasoning.py,
serving/tool_output.py) split it.

Where a token goes is read off the token ids: the tokens are decoded again as the engine
does (`IncrementalDetokenizer`, special tokens skipped), so each marker's offset in the
engine's text is the length of the text decoded before it. The engine's text itself is
kept, so what a stop string cut stays cut, and a stream and a full response agree: markers
are written only where the engine's text has reached them. The audit record digests this
text (markers included): it is what the readers split.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gateway.engine import DecodeResult, Delta, IncrementalDetokenizer


class ShownText:
    """One output's text with ``markers`` (token id -> its text) written in (see the module
    docstring); `feed` each delta's text and tokens, in order."""

    def __init__(
        self, tokenizer: Any, markers: Mapping[int, str], context_ids: tuple[int, ...] = ()
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, context_ids)
        self._markers = dict(markers)
        self._decoded = 0  # characters the tokens so far decode to, special tokens skipped
        self._pending: deque[tuple[int, str]] = deque()  # (offset, marker) not written yet
        self._seen = 0  # characters of the engine's text fed so far

    def feed(self, text: str, token_ids: tuple[int, ...] | list[int]) -> str:
        """The engine's ``text`` (released with or after ``token_ids``) with the markers that
        fall in it, or at its end, written in."""
        for t in token_ids:
            if t in self._markers:
                self._pending.append((self._decoded, self._markers[t]))
            self._decoded += len(self._detok.push(t))
        start, out, at = self._seen, [], 0
        while self._pending and self._pending[0][0] <= start + len(text):
            offset, marker = self._pending.popleft()
            cut = max(at, offset - start)
            out += [text[at:cut], marker]
            at = cut
        out.append(text[at:])
        self._seen += len(text)
        return "".join(out)


class Shown:
    """One request's outputs read with markers: a `ShownText` per choice for its stream,
    and its whole results (`of` gives None where a request needs none)."""

    def __init__(self, tokenizer: Any, markers: Mapping[int, str], context: tuple[int, ...]):
        self.tokenizer, self.markers, self.context = tokenizer, dict(markers), context
        self._streams: dict[int, ShownText] = {}

    @classmethod
    def of(cls, prepared: Any) -> Shown | None:
        """For a prepared request (serving/prepare.py): its tool format's markers and its
        reasoning convention's (`Reasoning.shown`); None when it has none."""
        markers = markers_of(prepared.schema, prepared.reasoning)
        if not markers:
            return None
        context = tuple(prepared.prompt_ids[-6:])  # as the engine's detokenizer has it
        return cls(prepared.engine.tokenizer, markers, context)

    def delta(self, index: int, delta: Delta) -> Delta:
        """Choice ``index``'s next delta, its text with the markers written in."""
        if index not in self._streams:
            self._streams[index] = ShownText(self.tokenizer, self.markers, self.context)
        return replace(delta, text=self._streams[index].feed(delta.text, delta.token_ids))

    def result(self, result: DecodeResult) -> DecodeResult:
        """A whole result, its text with the markers written in (what its stream gives)."""
        stream = ShownText(self.tokenizer, self.markers, self.context)
        return replace(result, text=stream.feed(result.text, result.token_ids))


def markers_of(schema: Mapping[str, Any] | None, reasoning: Any = None) -> dict[int, str]:
    """The markers a request's output is read with: a tool format's (the compiled tools'
    ``shown``) and a reasoning convention's (`Reasoning.shown`); empty for most requests."""
    markers: dict[int, str] = {}
    if schema and isinstance(schema.get("shown"), Mapping):
        markers.update({int(i): m for m, i in schema["shown"].items()})
    if reasoning is not None and getattr(reasoning, "shown", None):
        markers.update(reasoning.shown)
    return markers
