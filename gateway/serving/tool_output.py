"""The model's tool-call text (in its family's syntax, `gateway.engine.constraints.
tool_formats`) read back as OpenAI's tool calls, incrementally for streams and whole for
full responses: one parser per format, so a stream and a full response of the same output
always agree.

`ToolCallReader(fmt).feed(text)` returns events in output order:

- ``("content", text)``: answer text (text that may still turn out to be the opening tag is
  held back until it cannot);
- ``("call", index, name)``: a call opened and its name is complete;
- ``("arguments", index, fragment)``: the next piece of that call's arguments JSON (the
  wrapper around it, its closing and the separators are never sent). JSON formats send the
  arguments as the model writes them; pythonic calls send them whole, as JSON, once the
  call's ``)`` is written.

`finish()` flushes what was held back (an output cut short by max_tokens or a stop string).

A format whose markers are special tokens is read either from what follows its tag
(``hidden_tag``: Llama's, Mistral's and Granite's visible JSON) or, where nothing visible is
left to read (Mistral v11's ``[TOOL_CALLS]f[ARGS]{...}``, gpt-oss's channels), from the
text with the markers written back (serving/shown.py).

`check_output` validates a finished output (tool calls or a response_format document) in a
helper thread under a time budget, so a costly schema never blocks the event loop.
"""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.engine.constraints import FORMATS, HERMES, ConstraintError, ToolFormat, validate_output
from gateway.serving.errors import invalid

Event = tuple[str, int, str] | tuple[str, str]
VALIDATION_BUDGET_S = 0.5
"""Most seconds the validation of one finished output may take (it runs in a helper thread;
with RE2 for the regexes it takes milliseconds): past it the request is refused with a 400
(code schema_validation_timeout) instead of the event loop waiting."""
_OPEN = "([{"
_CLOSE = ")]}"
_CALL_START = '{"name":"'
"""How every JSON format's call starts."""


def format_of(schema: Mapping[str, Any] | None) -> ToolFormat:
    """The format a compiled tool grammar's schema names (`compile_tool_grammar`)."""
    name = schema.get("format") if schema else None
    fmt = FORMATS.get(name, HERMES) if isinstance(name, str) else HERMES
    return replace(fmt, hidden_tag=True) if schema and schema.get("hidden_tag") else fmt


def held_back(buf: str, marker: str) -> int:
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
class _Scanner:
    """Where a JSON value or Python argument list ends: bracket depth outside strings."""

    depth: int = 0
    quote: str = ""
    escaped: bool = False

    def end(self, text: str, stop_at_zero: bool) -> int:
        """Index in ``text`` just past the value (JSON: its closing bracket) or, with
        ``stop_at_zero`` false (Python arguments), of the unmatched closing bracket; -1 when
        the value goes on past ``text``."""
        for i, ch in enumerate(text):
            if self.quote:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == self.quote:
                    self.quote = ""
            elif ch in "\"'":
                self.quote = ch
            elif ch in _OPEN:
                self.depth += 1
            elif ch in _CLOSE:
                self.depth -= 1
                if self.depth == 0 and stop_at_zero:
                    return i + 1
                if self.depth < 0:
                    return i
        return -1


def python_arguments_json(text: str) -> str:
    """Keyword arguments as a pythonic call writes them (``city="Paris", n=3``) as a compact
    JSON object; ConstraintError when they are not literals."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        assert isinstance(call, ast.Call) and not call.args
        return json.dumps(
            {kw.arg: _literal(kw.value) for kw in call.keywords if kw.arg is not None},
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )
    except (SyntaxError, AssertionError, ValueError, RecursionError) as exc:
        raise ConstraintError(f"pythonic call arguments are not literals: {exc}") from None


_NAMES = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool)):
        return node.value
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {_key(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def _key(node: ast.expr | None) -> str:
    value = _literal(node) if node is not None else None
    if not isinstance(value, str):
        raise ValueError("a dict key must be a string")
    return value


@dataclass
class ToolCallReader:
    """The incremental parser of one output in ``fmt`` (see the module docstring). States:
    text (answer text; ``start`` before anything for formats whose calls start the output),
    opening (after the tag), head (a call's name), arguments, close (the call's closing),
    between (calls)."""

    fmt: ToolFormat = HERMES
    state: str = ""
    buf: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    content: str = ""
    _scan: _Scanner = field(default_factory=_Scanner)
    _pending: str = ""

    def __post_init__(self) -> None:
        if not self.state:
            self.state = "text" if self.fmt.anywhere else "start"

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        events: list[Event] = []
        while True:
            before = (self.state, len(self.buf))
            self._step(events)
            if (self.state, len(self.buf)) == before:
                return events

    def _step(self, events: list[Event]) -> None:
        fmt = self.fmt
        if self.state == "text":
            hits = [(at, m) for m in self._marks() if (at := self.buf.find(m)) >= 0]
            at, mark = min(hits) if hits else (-1, "")
            held = max((held_back(self.buf, m) for m in self._marks()), default=0)
            cut = at if at >= 0 else len(self.buf) - held
            if cut:
                self._content(self.buf[:cut], events)
                self.buf = self.buf[cut:]
            if at >= 0 and fmt.hidden_tag:  # the visible rest of the opening, then a call
                self.buf, self.state = self.buf[len(mark) - len(_CALL_START) :], "head"
            elif at >= 0:
                self.state = "opening"
        elif self.state == "opening":  # the tag, maybe a space, the rest of the opening
            assert fmt.tag is not None
            rest = self.buf[len(fmt.tag) :]
            if fmt.tag_space and rest.startswith(" "):
                rest = rest[1:]
            after = fmt.trigger[len(fmt.tag) :]
            if rest.startswith(after):
                self.buf, self.state = rest[len(after) :], "head"
            elif not after.startswith(rest):
                self._content(self.buf[: len(fmt.tag)], events)  # only text (never from
                self.buf, self.state = self.buf[len(fmt.tag) :], "text"  # the grammar)
        elif self.state == "start":  # formats whose calls start the output
            self._start()
        elif self.state == "head":
            found = fmt.head_pattern.match(self.buf)
            if found:
                self.calls.append(ParsedCall(found.group(1)))
                events.append(("call", len(self.calls) - 1, found.group(1)))
                self.buf, self.state = self.buf[found.end() :], "arguments"
                self._scan = _Scanner()
        elif self.state == "arguments":
            self._arguments(events)
        elif self.state == "close":
            if self.buf.startswith(fmt.call_close):
                self.calls[-1].complete = True
                self.buf, self.state = self.buf[len(fmt.call_close) :], "between"
            elif self.buf and not fmt.call_close.startswith(self.buf):
                self.state = "text"  # not the format (the grammar never allows this)
        elif self.state == "between":
            more = fmt.separator + fmt.call_open
            if self.buf.startswith(more):
                self.buf, self.state = self.buf[len(more) :], "head"
            elif fmt.end and self.buf.startswith(fmt.end):
                self.buf, self.state = self.buf[len(fmt.end) :], "text"
            elif self.buf and not more.startswith(self.buf) and not fmt.end.startswith(self.buf):
                self.state = "text"  # not another call (the grammar never allows this)

    def _marks(self) -> tuple[str, ...]:
        """What the text state looks for: the tag (formats whose calls may follow text), or
        where the tag is hidden, the rest of the opening and a call's start (Mistral's
        ``[{"name":"``, `` [{"name":"`` too where a space may follow the tag)."""
        fmt = self.fmt
        if not fmt.anywhere or fmt.tag is None:
            return ()
        if not fmt.hidden_tag:
            return (fmt.tag,)
        mark = fmt.after_tag + _CALL_START
        return (mark, " " + mark) if fmt.tag_space else (mark,)

    def _start(self) -> None:
        fmt, buf = self.fmt, self.buf
        if fmt.prefix and buf.startswith(fmt.prefix):
            self.buf = buf = buf[len(fmt.prefix) :]
        elif fmt.prefix and fmt.prefix.startswith(buf):
            return  # maybe the prefix: wait (an empty output waits too)
        opening = fmt.opening + fmt.call_open
        if opening and buf.startswith(opening):
            self.buf, self.state = buf[len(opening) :], "head"
        elif opening and opening.startswith(buf):
            return
        elif not opening and buf.startswith("{"):
            self.state = "head"
        elif buf:
            self.state = "text"

    def _arguments(self, events: list[Event]) -> None:
        end = self._scan.end(self.buf, stop_at_zero=not self.fmt.python)
        if not self.fmt.python:  # JSON: sent as written
            self._send(self.buf if end < 0 else self.buf[:end], events)
        elif end < 0:  # pythonic: sent whole, as JSON, once the call's ")" is written
            self._pending += self.buf
        else:
            written, self._pending = self._pending + self.buf[:end], ""
            try:
                self._send(python_arguments_json(written), events)
            except ConstraintError:  # never from the grammar: the check names it
                self._send(written, events)
        if end < 0:
            self.buf = ""
        else:
            self.buf, self.state = self.buf[end:], "close"

    def _content(self, text: str, events: list[Event]) -> None:
        if text:
            self.content += text
            events.append(("content", text))

    def _send(self, text: str, events: list[Event]) -> None:
        if text:
            self.calls[-1].arguments += text
            events.append(("arguments", len(self.calls) - 1, text))

    def finish(self) -> list[Event]:
        """What was held back: answer text (a call cut short keeps the arguments sent)."""
        events: list[Event] = []
        if self.state in ("text", "start", "opening"):
            self._content(self.buf, events)
        self.buf = ""
        return events


def read_calls(text: str, fmt: ToolFormat = HERMES) -> tuple[str, list[ParsedCall]]:
    """A whole output: its answer text and its calls."""
    reader = ToolCallReader(fmt)
    reader.feed(text)
    reader.finish()
    return reader.content, reader.calls


def check_calls(text: str, parameters: dict[str, dict[str, Any]], fmt: ToolFormat = HERMES) -> None:
    """ConstraintError unless every complete call names a tool and its arguments validate
    (jsonschema) against that tool's parameters schema."""
    for call in read_calls(text, fmt)[1]:
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
        asyncio.to_thread(check_calls, text, tools, format_of(schema))
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
