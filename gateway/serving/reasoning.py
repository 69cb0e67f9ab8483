"""Reasoning output: a thinking model's thinking kept apart from its answer.

Two conventions, each read off the model's chat template (once per tokenizer):

- think tags (Qwen3, QwQ, DeepSeek-R1 and its distills, and others): `<think>…</think>`
  before the answer. Some templates end the generation prompt inside the thinking (the
  start tag is the prompt's last text): the output then begins in thinking (`inside`).
- harmony channels (gpt-oss): the thinking is an analysis message,
  ``<|channel|>analysis<|message|>…<|end|>``, the answer a final message,
  ``<|start|>assistant<|channel|>final<|message|>…``, a tool call a commentary message to
  ``functions.NAME``. Its markers are special tokens, which the engine's text does not
  show: they are written back into the text for reading (serving/shown.py, `Reasoning.shown`).

What it does:
- a reader (`Reasoning.reader`: `ReasoningReader` for tags, `ChannelReader` for channels)
  splits an output, fed piece by piece, into ``("reasoning", text)`` and
  ``("content", text)`` events (text that may still turn out to be a marker is held back
  until it cannot); `split` is the same reader over a whole text, so a stream and a full
  response of the same output always agree. Tags: whitespace between the end tag and the
  answer is dropped. Channels: the analysis messages are the reasoning, the final
  message's text the content, and a call is passed on to the tool-call reader in its
  format's canonical form (``<|channel|>commentary to=functions.f <|constrain|>json
  <|message|>{...}``, whatever order the model wrote its header in).
- `grammar` wraps a request's grammar (response_format, tool calls) in the engine's
  ThinkingFirst (tags) or ChannelsFirst (channels), so the schema constrains the answer, not
  the thinking, and caps the thinking at the tenant's `reasoning.max_tokens`. That needs
  each marker to be one token of the vocabulary (it is in those models' tokenizers); where
  it is not, the grammar applies from the first token as before and the thinking is not
  capped.
- `reasoning_tokens` counts the thinking's tokens (markers included) for usage and the
  record.
"""

from __future__ import annotations

import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.engine import Grammar
from gateway.engine.constraints import Channels, ChannelsFirst, Markers, ThinkingFirst
from gateway.serving.tool_output import held_back

START, END = "<think>", "</think>"
H_START, H_CHANNEL, H_MESSAGE, H_END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
H_CONSTRAIN, H_CALL, H_RETURN = "<|constrain|>", "<|call|>", "<|return|>"
HARMONY_MARKERS = (H_START, H_CHANNEL, H_MESSAGE, H_END, H_CONSTRAIN, H_CALL, H_RETURN)
Event = tuple[str, str]


class Reader(Protocol):
    """Splits an output into reasoning and content events (see the module docstring)."""

    reasoning: str
    content: str
    thought: bool

    def feed(self, text: str) -> list[Event]: ...

    def finish(self) -> list[Event]: ...


@dataclass(frozen=True)
class Reasoning:
    """A model's thinking convention as one request sees it."""

    markers: Markers | None  # the tags as token ids, when each is one token
    inside: bool  # the prompt ended inside the thinking
    channels: Channels | None = None  # harmony's frame as token ids (channels only)
    shown: tuple[tuple[int, str], ...] = ()
    """The special tokens written back into the output's text for reading (channels)."""
    harmony: bool = False  # the convention: harmony channels, else think tags

    def reader(self) -> Reader:
        """A new reader of one output."""
        return ChannelReader() if self.harmony else ReasoningReader(inside=self.inside)


def _template(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template if isinstance(template, str) else ""


def _harmony(template: str) -> bool:
    return H_CHANNEL in template and H_MESSAGE in template


def thinks(tokenizer: Any) -> bool:
    """Whether the model's chat template uses think tags or harmony channels (a string
    check: cheap)."""
    template = _template(tokenizer)
    return (START in template and END in template) or _harmony(template)


def detect(tokenizer: Any, prompt_text: str) -> Reasoning | None:
    """The request's Reasoning when the model's chat template uses think tags or harmony
    channels, else None."""
    if not thinks(tokenizer):
        return None
    if _harmony(_template(tokenizer)):
        channels, shown = _harmony_tokens(tokenizer)
        return Reasoning(None, False, channels, shown, harmony=True)
    tail = prompt_text.rstrip()
    return Reasoning(_markers(tokenizer), inside=tail.endswith(START))


_MARKERS: weakref.WeakKeyDictionary[Any, Markers | None] = weakref.WeakKeyDictionary()
_HARMONY: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _harmony_tokens(tokenizer: Any) -> tuple[Channels | None, tuple[tuple[int, str], ...]]:
    """Harmony's frame as token ids (None unless its markers are single tokens) and the
    markers the engine's text does not show (special tokens), read once per tokenizer."""
    with _LOCK:
        if tokenizer in _HARMONY:
            return _HARMONY[tokenizer]  # type: ignore[no-any-return]

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False))

    single = {m: ids(m)[0] for m in HARMONY_MARKERS if len(ids(m)) == 1}
    channels = None
    if all(m in single for m in (H_START, H_CHANNEL, H_MESSAGE, H_END)):
        channels = Channels(
            analysis=ids(f"{H_CHANNEL}analysis{H_MESSAGE}"),
            end=single[H_END],
            start=ids(f"{H_START}assistant"),
            final=ids(f"{H_CHANNEL}final{H_MESSAGE}"),
            channel=single[H_CHANNEL],
        )
    hidden = tuple(
        (i, m)
        for m, i in single.items()
        if m not in (H_CALL, H_RETURN) and not tokenizer.decode([i], skip_special_tokens=True)
    )
    found = (channels, hidden)
    with _LOCK:
        _HARMONY[tokenizer] = found
    return found


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
    does not think, or its markers are not single tokens."""
    if reasoning is None or (inner is None and budget is None):
        return inner
    if reasoning.channels is not None:
        return ChannelsFirst(inner, reasoning.channels, budget)
    if reasoning.markers is None:
        return inner
    return ThinkingFirst(inner, reasoning.markers, reasoning.inside, budget)


def reasoning_tokens(token_ids: tuple[int, ...] | list[int], reasoning: Reasoning | None) -> int:
    """How many of the output's tokens are thinking (the markers included): tags: up to the
    end tag, or all of them when the output ended before it; channels: every analysis
    message, from its header to its ``<|end|>``; 0 when it never thought."""
    if reasoning is not None and reasoning.channels is not None:
        return _analysis_tokens(list(token_ids), reasoning.channels)
    if reasoning is None or reasoning.markers is None or not token_ids:
        return 0
    m = reasoning.markers
    ids = list(token_ids)
    if not reasoning.inside and ids[0] != m.start:
        return 0
    return ids.index(m.end) + 1 if m.end in ids else len(ids)


def _analysis_tokens(ids: list[int], c: Channels) -> int:
    count, i, n = 0, 0, len(c.analysis)
    while i < len(ids):
        if ids[i : i + n] == list(c.analysis):
            end = ids.index(c.end, i + n) + 1 if c.end in ids[i + n :] else len(ids)
            count += end - i
            i = end
        else:
            i += 1
    return count


@dataclass
class _Splitter:
    """What both readers share: the text held back, the two texts so far, and the events
    of one `feed` (consecutive text of one kind joined)."""

    buf: str = ""
    reasoning: str = ""
    content: str = ""
    thought: bool = False
    _events: list[Event] = field(default_factory=list)

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        self._events = []
        while self.buf and self._step():
            pass
        return self._events

    def _step(self) -> bool:
        """Consume what can be decided from the buffer; False when it must wait for more."""
        raise NotImplementedError

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


@dataclass
class ReasoningReader(_Splitter):
    """Splits an output into reasoning and content events (see the module docstring)."""

    inside: bool = False
    state: str = "open"  # open | think | gap | answer
    # thought: the output began with (or in) thinking

    def __post_init__(self) -> None:
        if self.inside:
            self.state, self.thought = "think", True

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


_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(H_CHANNEL) + r"\s*([^\s<]+)")
_ENDS = (H_END, H_CALL, H_RETURN)


@dataclass
class ChannelReader(_Splitter):
    """Splits a harmony output (its markers written in) into reasoning and content events
    (see the module docstring). States: between (messages), header (up to ``<|message|>``)
    and body (up to ``<|end|>``, or a marker that opens another message)."""

    state: str = "between"
    kind: str = "content"  # what the current body is: reasoning or content
    # thought: an analysis message was written

    def finish(self) -> list[Event]:
        """Flush what was held back (an output cut short)."""
        self._events = []
        if self.buf and self.state != "header":
            self._emit(self.kind if self.state == "body" else "content", self.buf)
        self.buf = ""
        return self._events

    def _step(self) -> bool:
        if self.state == "between":
            if self.buf.startswith((H_START, H_CHANNEL)):
                self.state = "header"
                return True
            if H_START.startswith(self.buf) or H_CHANNEL.startswith(self.buf):
                return False  # may still become a marker
            self.state, self.kind = "body", "content"  # text outside any message
            return True
        if self.state == "header":
            at = self.buf.find(H_MESSAGE)
            if at < 0:
                return False
            self._header(self.buf[:at])
            self.buf, self.state = self.buf[at + len(H_MESSAGE) :], "body"
            return True
        # body: up to the message's end, or a marker that opens another message
        hits = [(at, m) for m in (*_ENDS, H_START, H_CHANNEL) if (at := self.buf.find(m)) >= 0]
        if hits:
            at, mark = min(hits)
            self._emit(self.kind, self.buf[:at])
            self.buf = self.buf[at + len(mark) :] if mark in _ENDS else self.buf[at:]
            self.state = "between"
            return True
        keep = max(held_back(self.buf, m) for m in (*_ENDS, H_START, H_CHANNEL))
        self._emit(self.kind, self.buf[: len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep :]
        return False

    def _header(self, header: str) -> None:
        """Where the message's body goes: analysis is reasoning; a message to a function is
        a call, passed on in the canonical form; anything else (final) is content."""
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if channel is not None and channel.group(1) == "analysis":
            self.kind, self.thought = "reasoning", True
        elif recipient is not None and recipient.group(1).startswith("functions."):
            self.kind = "content"
            name = recipient.group(1).removeprefix("functions.")
            head = f"{H_CHANNEL}commentary to=functions.{name} {H_CONSTRAIN}json{H_MESSAGE}"
            self._emit("content", head)
        else:
            self.kind = "content"


def split(text: str, reasoning: Reasoning | None) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole output, as a stream of it would be split."""
    if reasoning is None:
        return None, text
    reader = reasoning.reader()
    reader.feed(text)
    reader.finish()
    return (reader.reasoning if reader.thought else None), reader.content
