"""Reasoning output: a thinking model's `<think>…</think>` kept apart from its answer.

Which models: those whose chat template writes the think tags (Qwen3, QwQ, DeepSeek-R1 and
its distills, and others trained on the same convention); `detect` reads the template once
per tokenizer. Some templates end the generation prompt inside the thinking (the start tag
is the prompt's last text): the output then begins in thinking (`inside`).

What it does:
- `ReasoningReader` splits an output, fed piece by piece, into ``("reasoning", text)`` and
  ``("content", text)`` events (text that may still turn out to be a tag is held back until
  it cannot); `split` is the same reader over a whole text, so a stream and a full response
  of the same output always agree. Whitespace between the end tag and the answer is dropped.
- `grammar` wraps a request's grammar (response_format, tool calls) in the engine's
  ThinkingFirst, so the schema constrains the answer, not the thinking, and caps the
  thinking at the tenant's `reasoning.max_tokens`. That needs each tag to be one token of the
  vocabulary (it is in those models' tokenizers); where it is not, the grammar applies from
  the first token as before and the thinking is not capped.
- `reasoning_tokens` counts the thinking's tokens (tags included) for usage and the record.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from gateway.engine import Grammar
from gateway.engine.constraints.reasoning import Markers, ThinkingFirst
from gateway.serving.tool_output import held_back

START, END = "<think>", "</think>"
Event = tuple[str, str]


@dataclass(frozen=True)
class Reasoning:
    """A model's thinking convention as one request sees it."""

    markers: Markers | None  # the tags as token ids, when each is one token
    inside: bool  # the prompt ended inside the thinking


def thinks(tokenizer: Any) -> bool:
    """Whether the model's chat template uses think tags (a string check: cheap)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and START in template and END in template


def detect(tokenizer: Any, prompt_text: str) -> Reasoning | None:
    """The request's Reasoning when the model's chat template uses think tags, else None."""
    if not thinks(tokenizer):
        return None
    tail = prompt_text.rstrip()
    return Reasoning(_markers(tokenizer), inside=tail.endswith(START))


_MARKERS: weakref.WeakKeyDictionary[Any, Markers | None] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _markers(tokenizer: Any) -> Markers | None:
    """The tags as single token ids and the vocabulary's whitespace tokens (read once per
    tokenizer), or None when a tag takes several tokens."""
    with _LOCK:
        if tokenizer in _MARKERS:
            return _MARKERS[tokenizer]
    ids = [tokenizer.encode(tag, add_special_tokens=False) for tag in (START, END)]
    markers = None
    if all(len(i) == 1 for i in ids):
        vocab = len(tokenizer)
        texts = tokenizer.batch_decode([[i] for i in range(vocab)])
        space = frozenset(i for i, t in enumerate(texts) if t and not t.strip())
        markers = Markers(ids[0][0], ids[1][0], space)
    with _LOCK:
        _MARKERS[tokenizer] = markers
    return markers


def grammar(
    inner: Grammar | None, reasoning: Reasoning | None, budget: int | None
) -> Grammar | None:
    """`inner` for a model that thinks first: wrapped so that it constrains the answer only
    and the thinking stops after `budget` tokens (None: no cap). Unchanged where the model
    does not think, or its tags are not single tokens."""
    if reasoning is None or reasoning.markers is None or (inner is None and budget is None):
        return inner
    return ThinkingFirst(inner, reasoning.markers, reasoning.inside, budget)


def reasoning_tokens(token_ids: tuple[int, ...] | list[int], reasoning: Reasoning | None) -> int:
    """How many of the output's tokens are thinking (the tags included): up to the end tag,
    or all of them when the output ended before it; 0 when it never thought."""
    if reasoning is None or reasoning.markers is None or not token_ids:
        return 0
    m = reasoning.markers
    ids = list(token_ids)
    if not reasoning.inside and ids[0] != m.start:
        return 0
    return ids.index(m.end) + 1 if m.end in ids else len(ids)


@dataclass
class ReasoningReader:
    """Splits an output into reasoning and content events (see the module docstring)."""

    inside: bool = False
    state: str = "open"  # open | think | gap | answer
    buf: str = ""
    reasoning: str = ""
    content: str = ""
    thought: bool = False  # the output began with (or in) thinking
    _events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.inside:
            self.state, self.thought = "think", True

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        self._events = []
        while self.buf and self._step():
            pass
        return self._events

    def finish(self) -> list[Event]:
        """Flush what was held back (an output cut short)."""
        self._events = []
        if self.buf:
            self._emit("reasoning" if self.state == "think" else "content", self.buf)
            self.buf = ""
        return self._events

    def _step(self) -> bool:
        """Consume what can be decided from the buffer; False when it must wait for more."""
        if self.state == "open":
            head = self.buf.lstrip()
            if head.startswith(START):
                self.buf, self.state, self.thought = head[len(START) :], "think", True
                return True
            if START.startswith(head):
                return False  # may still become the tag
            self.state = "answer"
            return True
        if self.state == "think":
            at = self.buf.find(END)
            if at >= 0:
                self._emit("reasoning", self.buf[:at])
                self.buf, self.state = self.buf[at + len(END) :], "gap"
                return True
            keep = held_back(self.buf, END)
            self._emit("reasoning", self.buf[: len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep :]
            return False
        if self.state == "gap":
            self.buf = self.buf.lstrip()
            if not self.buf:
                return False
            self.state = "answer"
            return True
        self._emit("content", self.buf)
        self.buf = ""
        return False

    def _emit(self, kind: str, text: str) -> None:
        if not text:
            return
        if kind == "reasoning":
            self.reasoning += text
        else:
            self.content += text
        if self._events and self._events[-1][0] == kind:
            self._events[-1] = (kind, self._events[-1][1] + text)
        else:
            self._events.append((kind, text))


def split(text: str, reasoning: Reasoning | None) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole output, as a stream of it would be split."""
    if reasoning is None:
        return None, text
    reader = ReasoningReader(inside=reasoning.inside)
    reader.feed(text)
    reader.finish()
    return (reader.reasoning if reader.thought else None), reader.content
