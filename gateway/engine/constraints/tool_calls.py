"""Tool calls as a grammar: the model's tool-call syntax with each tool's parameters schema
inside, compiled by llguidance like any JSON schema (so speculation stays exact: the draft
and the target are masked by the same grammar).

The syntax is the Hermes / Qwen convention the demo chat template teaches (and Qwen2.5 and
Hermes models were trained on): every call is

    <tool_call>
    {"name":"<function name>","arguments":<arguments object>}
    </tool_call>

calls are separated by one newline, and the JSON is compact (no whitespace between tokens,
as in every grammar here, so a model cannot stall in whitespace). Two grammars:

- ``required``: the output is one call (or, with ``parallel``, one or more), nothing else;
  a named ``tool_choice`` is ``required`` over that one tool.
- ``auto``: free text, or free text followed by calls. The text may not contain the opening
  tag, so once the model writes ``<tool_call>`` the rest of the call is forced to a tool's
  name and its schema. After the calls only more calls (``parallel``) or the end follow.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
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

TAG: Final = "<tool_call>"
OPEN: Final = TAG + "\n"
CLOSE: Final = "\n</tool_call>"
SEPARATOR: Final = "\n"
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


def call_prefix(name: str) -> str:
    """The text of a call up to its arguments: what the grammar forces once the name is
    chosen."""
    return '{"name":' + json.dumps(name) + ',"arguments":'


def grammar_text(
    tools: Sequence[ToolSpec], mode: ToolMode, parallel: bool, tag_token: bool = False
) -> str:
    """The Lark grammar (llguidance's dialect) of the calls the model may emit.

    ``tag_token``: the tokenizer has the opening tag as one added token (Qwen2.5, Hermes),
    which llguidance keeps apart from text: the grammar then names that token (``<tag>``),
    since text bytes can never produce it (a literal would even mask it in and then refuse
    it)."""
    if not tools:
        raise ToolError("tools must contain at least one function", None)
    options = {"x-guidance": dict(JSON_OPTIONS)}
    lines = ["%llguidance {}"]
    more = f" ({json.dumps(SEPARATOR)} call)*" if parallel else ""
    opener = f'{TAG} "\\n"' if tag_token else json.dumps(OPEN)
    if mode == "required":
        lines.append(f"start: call{more}")
    elif tag_token:
        lines.append(f"start: TEXT | TEXT? {opener} call_body{more}")
    else:
        lines += [
            f"start: TEXT | head call_body{more}",
            "head[lazy]: /(?s:.*)<tool_call>\\n/",  # lazy: up to the first opening tag
        ]
    if mode == "auto":
        # the answer's text never holds the opening tag: writing it starts a call
        lines.append("TEXT: /(?s:.*)/ & ~/(?s:.*)<tool_call>(?s:.*)/")
    names = " | ".join(f"fn_{i}" for i in range(len(tools)))
    lines += [
        f"call: {opener} call_body",
        f"call_body: ({names}) {json.dumps(CLOSE)}",
    ]
    for i, tool in enumerate(tools):
        schema = {**tool.parameters, **options}
        lines.append(f'fn_{i}: {json.dumps(call_prefix(tool.name))} args_{i} "}}"')
        lines.append(f"args_{i}: %json {json.dumps(schema, allow_nan=False)}")
    return "\n".join(lines) + "\n"


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
    tokenizer: Any, tools: Sequence[ToolSpec], mode: ToolMode, parallel: bool, vocab_size: int
) -> CompiledGrammar:
    """Check the tools and compile their grammar (cached like JSON schemas). The compiled
    grammar's ``schema`` is ``{"tools": {name: parameters}}``, what its output must obey."""
    check_tools(tools)
    added: dict[str, int] = getattr(tokenizer, "get_added_vocab", dict)()
    text = grammar_text(tools, mode, parallel, tag_token=TAG in added)
    digest = hashlib.sha256(text.encode()).hexdigest()
    schema = {"tools": {t.name: t.parameters for t in tools}}
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
    "ToolMode",
    "ToolSpec",
    "call_prefix",
    "check_tools",
    "compile_tool_grammar",
    "grammar_text",
]
