"""The model's tool-call text (the syntax of `gateway.engine.constraints.tool_calls`) read
back as OpenAI's tool calls, incrementally for streams and whole for full responses: one
parser, so a stream and a full response of the same output always agree.

`ToolCallReader.feed(text)` returns events in output order:

- ``("content", text)``: answer text (text that may still turn out to be the opening tag is
  held back until it cannot);
- ``("call", index, name)``: a call opened and its name is complete;
- ``("arguments", index, fragment)``: the next piece of that call's arguments JSON (the
  closing ``}`` of the wrapper and the closing tag are held back and never sent).

`finish()` flushes what was held back (an output cut short by max_tokens or a stop string).

`check_output` validates a finished output (tool calls or a response_format document) in a
helper thread under a time budget, so a costly schema never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.engine.constraints.json_schema import ConstraintError, validate_output
from gateway.engine.constraints.tool_calls import CLOSE, OPEN, SEPARATOR
from gateway.serving.errors import invalid

Event = tuple[str, int, str] | tuple[str, str]
_HEAD = re.compile(r'\{"name":"([A-Za-z0-9_-]{1,64})","arguments":')
_END = "}" + CLOSE
_NEXT = SEPARATOR + OPEN
VALIDATION_BUDGET_S = 0.5
"""Most seconds the validation of one finished output may take (it runs in a helper thread;
with RE2 for the regexes it takes milliseconds): past it the request is refused with a 400
(code schema_validation_timeout) instead of the event loop waiting."""


def _held(buf: str, marker: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``marker``."""
    for n in range(min(len(buf), len(marker) - 1), 0, -1):
        if marker.startswith(buf[-n:]):
            return n
    return 0


@dataclass
class ParsedCall:
    name: str
    arguments: str = ""
    complete: bool = False


@dataclass
class ToolCallReader:
    state: str = "text"  # text | head | arguments | between
    buf: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        events: list[Event] = []
        while True:
            before = (self.state, len(self.buf))
            self._step(events)
            if (self.state, len(self.buf)) == before:
                return events

    def _step(self, events: list[Event]) -> None:
        if self.state == "text":
            at = self.buf.find(OPEN)
            cut = at if at >= 0 else len(self.buf) - _held(self.buf, OPEN)
            self._content(self.buf[:cut], events)
            self.buf = self.buf[cut:]
            if at >= 0:
                self.buf, self.state = self.buf[len(OPEN) :], "head"
        elif self.state == "head":
            found = _HEAD.match(self.buf)
            if found:
                self.calls.append(ParsedCall(found.group(1)))
                events.append(("call", len(self.calls) - 1, found.group(1)))
                self.buf, self.state = self.buf[found.end() :], "arguments"
        elif self.state == "arguments":
            at = self.buf.find(_END)
            cut = at if at >= 0 else len(self.buf) - _held(self.buf, _END)
            self._arguments(self.buf[:cut], events)
            self.buf = self.buf[cut:]
            if at >= 0:
                self.calls[-1].complete = True
                self.buf, self.state = self.buf[len(_END) :], "between"
        elif self.buf.startswith(_NEXT):  # between calls
            self.buf, self.state = self.buf[len(_NEXT) :], "head"
        elif self.buf and not _NEXT.startswith(self.buf):
            self.state = "text"  # not another call (the grammar never allows this)

    def _content(self, text: str, events: list[Event]) -> None:
        if text:
            self.content += text
            events.append(("content", text))

    def _arguments(self, text: str, events: list[Event]) -> None:
        if text:
            self.calls[-1].arguments += text
            events.append(("arguments", len(self.calls) - 1, text))

    def finish(self) -> list[Event]:
        """What was held back: answer text, or the arguments of a call cut short."""
        events: list[Event] = []
        if self.state == "text":
            self._content(self.buf, events)
        elif self.state == "arguments" and not _END.startswith(self.buf):
            self._arguments(self.buf, events)  # else cut inside the wrapper's closing
        self.buf = ""
        return events


def read_calls(text: str) -> tuple[str, list[ParsedCall]]:
    """A whole output: its answer text and its calls."""
    reader = ToolCallReader()
    reader.feed(text)
    reader.finish()
    return reader.content, reader.calls


def check_calls(text: str, parameters: dict[str, dict[str, Any]]) -> None:
    """ConstraintError unless every complete call names a tool and its arguments validate
    (jsonschema) against that tool's parameters schema."""
    for call in read_calls(text)[1]:
        if not call.complete:
            continue
        if call.name not in parameters:
            raise ConstraintError(f"the output calls an unknown function {call.name!r}")
        validate_output(call.arguments, parameters[call.name])


async def check_output(
    text: str,
    schema: dict[str, Any] | None,
    tools: dict[str, dict[str, Any]] | None = None,
    budget_s: float = VALIDATION_BUDGET_S,
) -> None:
    """`check_calls` (``tools``: the parameters schema of each tool) or `validate_output`
    (``schema``) in a helper thread, off the event loop. ConstraintError as they raise it;
    a validation still running after ``budget_s`` is a 400 naming response_format (tools)
    with code schema_validation_timeout (its thread ends on its own, bounded by the output)."""
    work = (
        asyncio.to_thread(check_calls, text, tools)
        if tools is not None
        else asyncio.to_thread(validate_output, text, schema)
    )
    try:
        await asyncio.wait_for(work, timeout=budget_s)
    except TimeoutError:
        raise invalid(
            f"the output could not be validated against its schema within {budget_s} s; "
            "simplify the schema",
            "tools" if tools is not None else "response_format",
            code="schema_validation_timeout",
        ) from None
