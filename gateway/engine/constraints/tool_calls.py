"""Tool calls as a grammar: the model's tool-call syntax with each tool's parameters schema
inside, compiled by llguidance like any JSON schema (so speculation stays exact: the draft
and the target are masked by the same grammar).

The syntax is the model family's (`tool_formats`: Hermes/Qwen, Llama 3 JSON, Mistral,
Granite, pythonic), read off its chat template or named in its manifest. Hermes, the demo
template's, writes every call as

    <tool_call>
    {"name":"<function name>","arguments":<arguments object>}
    </tool_call>

and the JSON is compact (no whitespace between tokens, as in every grammar here, so a model
cannot stall in whitespace). Two grammars:

- ``required``: the output is one call (or, with ``parallel``, one or more), nothing else;
  a named ``tool_choice`` is ``required`` over that one tool.
- ``auto``: free text, or calls. Formats whose calls may follow text (Hermes, Mistral,
  Granite) forbid their opening tag in the text, so once the model writes it the rest of
  the call is forced to a tool's name and its schema (a lazy trigger); formats whose calls
  start the output (Llama 3 JSON, pythonic) forbid text that starts like a call, so a first
  ``{`` (or ``<|python_tag|>``) or ``[`` is a call. After the calls only more calls
  (``parallel``) or the format's end follow. gpt-oss (harmony) answers in a message of its
  own: auto mode is that message (``<|channel|>final<|message|>`` and free text) or a call;
  its one call ends the output.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from gateway.engine.constraints.json_schema import (
    JSON_OPTIONS,
    CompiledGrammar,
    ConstraintError,
    canonical_schema,
    check_enforceable,
    compile_grammar_text,
)
from gateway.engine.constraints.tool_formats import (
    HERMES,
    ToolFormat,
    model_format,
    python_arguments,
)

TAG: Final = HERMES.call_open.strip()
OPEN: Final = HERMES.call_open
CLOSE: Final = HERMES.call_close[1:]
SEPARATOR: Final = HERMES.separator
NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""OpenAI's rule for function names (so a name needs no escaping in JSON or Lark)."""
ToolMode = Literal["auto", "required"]


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call: its name and its arguments' JSON schema."""

    name: str
    parameters: dict[str, Any]


class ToolError(ConstraintError):
    """A tool the grammar cannot enforce: ``index`` is its position in the request's tools,
    ``field`` the part at fault (``name`` or ``parameters``)."""

    def __init__(self, message: str, index: int | None, field: str = "parameters") -> None:
        super().__init__(message)
        self.index = index
        self.field = field


def call_prefix(name: str, fmt: ToolFormat = HERMES) -> str:
    """The text of a call up to its arguments: what the grammar forces once the name is
    chosen."""
    return fmt.head(name)


def _literal(text: str, fmt: ToolFormat, ids: Mapping[str, int]) -> str:
    """``text`` in Lark: quoted, each of the format's markers in it as the added token when
    the tokenizer has one (``ids``; llguidance keeps added tokens apart from text, so the
    grammar must name them), the tag followed by an optional space where the format allows
    one."""
    if not text:
        return ""
    found = [m for m in fmt.markers if m in text and (m in ids or (m == fmt.tag and fmt.tag_space))]
    if not found:
        return json.dumps(text)
    parts = []
    for piece in re.split("(" + "|".join(re.escape(m) for m in found) + ")", text):
        if piece in found:
            parts.append(f"<[{ids[piece]}]>" if piece in ids else json.dumps(piece))
            if piece == fmt.tag and fmt.tag_space:
                parts.append('" "?')
        elif piece:
            parts.append(json.dumps(piece))
    return " ".join(parts)


def grammar_text(
    tools: Sequence[ToolSpec],
    mode: ToolMode,
    parallel: bool,
    fmt: ToolFormat = HERMES,
    ids: Mapping[str, int] | None = None,
) -> str:
    """The Lark grammar (llguidance's dialect) of the calls the model may emit in ``fmt``.

    ``ids``: the format's markers that the tokenizer has as one added token each, by their
    text (Qwen2.5, Hermes, Llama, Mistral and Granite tokenizers have their tags so), which
    llguidance keeps apart from text: the grammar then names that token, since text bytes
    can never produce it (a literal would even mask it in and then refuse it)."""
    if not tools:
        raise ToolError("tools must contain at least one function", None)
    ids = ids or {}
    tag_id = ids.get(fmt.tag) if fmt.tag is not None else None

    def lit(text: str) -> str:
        return _literal(text, fmt, ids)

    lines = ["%llguidance {}"]
    more = f" ({lit(fmt.separator)} call)*" if parallel and fmt.parallel else ""
    tail = f"{more} {lit(fmt.end)}".rstrip()
    opening = f"{lit(fmt.opening)} {lit(fmt.call_open)}".strip()
    if mode == "required":
        lines.append(f"start: {opening} body{tail}".replace("start:  ", "start: "))
    elif fmt.answer_header:  # the answer is a message of its own, or the calls are
        lines.append(f"start: {lit(fmt.answer_header)} TEXT | {opening} body{tail}")
        lines.append("TEXT: /(?s:.*)/")
    elif not fmt.anywhere:  # calls only start the output, optionally after the prefix
        prefix = f"({lit(fmt.prefix)})? " if fmt.prefix else ""
        lines.append(f"start: TEXT | {prefix}{opening} body{tail}".replace("|  ", "| "))
        first = fmt.head("x")[0] if not fmt.trigger else fmt.trigger[0]
        refuse = f"\\s*{_escape(first)}"
        if fmt.prefix:
            refuse += "|" + _escape(fmt.prefix)
        lines.append(f"TEXT: /(?s:.*)/ & ~/(?s:({refuse}).*)/")
    else:
        assert fmt.tag is not None and fmt.trigger.startswith(fmt.tag)
        after = fmt.trigger[len(fmt.tag) :]
        if tag_id is not None:
            lines.append(f"start: TEXT | TEXT? {lit(fmt.tag)} {lit(after)} body{tail}")
        else:  # lazy: up to the first opening tag
            lines.append(f"start: TEXT | head body{tail}")
            space = " ?" if fmt.tag_space else ""
            lines.append(f"head[lazy]: /(?s:.*){_escape(fmt.tag)}{space}{_escape(after)}/")
        # the answer's text never holds the opening tag: writing it starts a call
        lines.append(f"TEXT: /(?s:.*)/ & ~/(?s:.*){_escape(fmt.tag)}(?s:.*)/")
    names = " | ".join(f"fn_{i}" for i in range(len(tools)))
    lines += [
        f"call: {lit(fmt.call_open)} body".replace(":  ", ": "),
        f"body: {names}",
    ]
    options = {"x-guidance": dict(JSON_OPTIONS)}
    for i, tool in enumerate(tools):
        close = lit(fmt.call_close)
        if fmt.python:
            try:
                args, rules = python_arguments(f"args_{i}", tool.parameters)
            except ConstraintError as exc:
                raise ToolError(f"function {tool.name!r}: {exc}", i) from None
            lines.append(f"fn_{i}: {lit(fmt.head(tool.name))} {args} {close}")
            lines += rules
        else:
            schema = {**tool.parameters, **options}
            lines.append(f"fn_{i}: {lit(fmt.head(tool.name))} args_{i} {close}")
            lines.append(f"args_{i}: %json {json.dumps(schema, allow_nan=False)}")
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    """``text`` as a literal inside a Lark /regex/ (Rust's regex syntax; its slash too)."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n")
        elif ch in "\\.+*?()|[]{}^$#&-~/":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def check_tools(tools: Sequence[ToolSpec]) -> None:
    """ToolError (naming the tool's index) for a bad name, a duplicate, or a parameters
    schema the grammar cannot enforce exactly (the rules of response_format's schemas)."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not NAME.fullmatch(tool.name):
            raise ToolError(
                f"function name {tool.name!r} must be 1 to 64 letters, digits, '_' or '-'",
                i,
                "name",
            )
        if tool.name in seen:
            raise ToolError(f"duplicate function name {tool.name!r}", i, "name")
        seen.add(tool.name)
        try:
            canonical_schema(tool.parameters)
            check_enforceable(tool.parameters)
            if tool.parameters.get("type") != "object":
                raise ConstraintError('a parameters schema must have "type": "object"')
        except ToolError:
            raise
        except ConstraintError as exc:
            raise ToolError(f"function {tool.name!r}: {exc}", i) from None


def compile_tool_grammar(
    tokenizer: Any,
    tools: Sequence[ToolSpec],
    mode: ToolMode,
    parallel: bool,
    vocab_size: int,
    tool_format: str | None = None,
) -> CompiledGrammar:
    """Check the tools and compile their grammar (cached like JSON schemas) in the model's
    syntax: ``tool_format`` (the manifest's) or the one its chat template teaches. The
    compiled grammar's ``schema`` is ``{"tools": {name: parameters}, "format": name}``,
    what its output must obey and how to read it back: with ``"hidden_tag": true`` where
    the format's tag is a special token, which the output's text does not show, or for a
    format read with its markers (`ToolFormat.shown_markers`) ``"shown"``: its markers that
    are special tokens, by their text, to write back into the output's text."""
    check_tools(tools)
    try:
        fmt = model_format(tokenizer, tool_format)
    except ConstraintError as exc:
        raise ToolError(str(exc), None) from None
    added: dict[str, int] = getattr(tokenizer, "get_added_vocab", dict)()
    ids = {m: added[m] for m in fmt.markers if m in added}
    text = grammar_text(tools, mode, parallel, fmt, ids)
    digest = hashlib.sha256(text.encode()).hexdigest()
    schema: dict[str, Any] = {"tools": {t.name: t.parameters for t in tools}, "format": fmt.name}
    # special tokens: the output's text (decoded without them) never shows them
    hidden = {m: i for m, i in ids.items() if not tokenizer.decode([i], skip_special_tokens=True)}
    if fmt.shown_markers and hidden:
        schema["shown"] = hidden  # written back into the text for reading (serving/shown.py)
    elif fmt.tag in hidden:
        schema["hidden_tag"] = True
    try:
        return compile_grammar_text(tokenizer, text, vocab_size, schema, digest)
    except ToolError:
        raise
    except ConstraintError as exc:
        raise ToolError(f"the tools' schemas cannot be compiled: {exc}", None) from None


__all__ = [
    "CLOSE",
    "OPEN",
    "SEPARATOR",
    "TAG",
    "ToolError",
    "ToolFormat",
    "ToolMode",
    "ToolSpec",
    "call_prefix",
    "check_tools",
    "compile_tool_grammar",
    "grammar_text",
]
