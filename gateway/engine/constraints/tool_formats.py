"""Tool-call syntaxes by model family, and which one a model speaks.

Every syntax has the same shape: an output is either answer text or

    [text] opening call (separator call)* end        call = call_open head arguments call_close

and the pieces differ by family (JSON compact, as in every grammar here):

==============  ===========================================================================
hermes          ``<tool_call>\\n{"name":"f","arguments":{...}}\\n</tool_call>`` per call,
                calls separated by a newline (Hermes, Qwen2.5, Qwen3, the demo template)
llama3_json     ``{"name":"f","parameters":{...}}``, calls separated by ``;``, at the start
                of the output, optionally after ``<|python_tag|>`` (Llama 3.1 to 3.3)
mistral         ``[TOOL_CALLS][{"name":"f","arguments":{...}}, ...]`` (a space may follow
                the tag: Mistral v0.3 writes one; Mistral, Mixtral, Ministral, Nemo)
mistral_v11     ``[TOOL_CALLS]f[ARGS]{...}`` per call, the calls written one after another
                (Mistral's tokenizer v11 and later: Mistral Small 3.2, Magistral, Devstral)
granite         ``<|tool_call|>[{"name":"f","arguments":{...}}, ...]`` (Granite 3.x)
harmony         ``<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}``, one
                call per output (it ends at ``<|call|>``), a message of its own after the
                thinking; in auto mode the answer is ``<|channel|>final<|message|>…`` (gpt-oss)
pythonic        ``[f(city="Paris", days=3), g()]`` at the start of the output, arguments
                as Python literals (Llama 4, Llama 3.2 pythonic, ToolACE, ...)
==============  ===========================================================================

``anywhere`` formats may follow answer text (the opening tag triggers the call); the others
only start an output (their opening is ordinary JSON or a bracket). ``tag`` (and
``args_tag``) are the markers a tokenizer may hold as one added token: the grammar then
names that token.

`detect_format` reads the syntax off the model's chat template (the template teaches the
model what it was trained on); a manifest may name it instead (``tool_format``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.engine.constraints.json_schema import JSON_OPTIONS, ConstraintError

IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool-call syntax (see the module docstring)."""

    name: str
    opening: str
    """Written once before the first call ("" when each call carries its own tag)."""
    call_open: str
    """Written before each call."""
    call_close: str
    """Written after each call's arguments."""
    separator: str
    """Between two calls."""
    end: str
    """After the last call."""
    tag: str | None
    """The marker that may be one added token of the tokenizer (None: plain text only)."""
    anywhere: bool
    """Calls may follow answer text; else they only start an output."""
    key: str = "arguments"
    """The JSON key of the arguments ("" for pythonic calls)."""
    prefix: str = ""
    """An optional marker before the opening (Llama's ``<|python_tag|>``)."""
    id_length: int | None = None
    """Call ids of exactly this many letters and digits (Mistral's templates refuse others)."""
    tag_space: bool = False
    """One space may follow the tag (Mistral v0.3 writes ``[TOOL_CALLS] [``, later Mistral
    models ``[TOOL_CALLS][``): the grammar lets the model write the one it learned."""
    hidden_tag: bool = False
    """The tag is a special token of the model's tokenizer, so the output's text (decoded
    without special tokens) never shows it: the calls are read from what follows it."""
    args_tag: str = ""
    """Written between a call's name and its arguments (Mistral v11's ``[ARGS]``): the call
    is ``name`` + this + the arguments object, with no wrapper around them."""
    tokens: tuple[str, ...] = ()
    """Further markers of the format's text that tokenizers hold as single tokens."""
    parallel: bool = True
    """Several calls may follow one another in one output (harmony's call ends the output)."""
    answer_header: str = ""
    """In auto mode, the answer's text is a message of its own, after this header."""
    shown_markers: bool = False
    """Its markers, where they are special tokens, are written back into the output's text
    for reading it: without them the text (``f{...}``) would not tell a call from answer
    text."""

    @property
    def python(self) -> bool:
        """Arguments are Python keyword arguments, not a JSON object."""
        return not self.key and not self.args_tag

    @property
    def markers(self) -> tuple[str, ...]:
        """The format's markers a tokenizer may hold as single tokens."""
        return tuple(dict.fromkeys(m for m in (self.tag, self.args_tag, *self.tokens) if m))

    def head(self, name: str) -> str:
        """A call's text from its start up to its arguments."""
        if self.args_tag:
            return name + self.args_tag
        if self.python:
            return f"{name}("
        return '{"name":' + json.dumps(name) + f',"{self.key}":'

    @property
    def head_pattern(self) -> re.Pattern[str]:
        """Matches a complete head; group 1 is the function name."""
        if self.args_tag:
            return re.compile(r"([A-Za-z0-9_-]{1,64})" + re.escape(self.args_tag))
        if self.python:
            return re.compile(r"([A-Za-z0-9_-]{1,64})\(")
        return re.compile(r'\{"name":"([A-Za-z0-9_-]{1,64})","' + self.key + '":')

    @property
    def trigger(self) -> str:
        """The text that opens the calls after answer text (``anywhere`` formats)."""
        return self.opening + self.call_open

    @property
    def after_tag(self) -> str:
        """The opening's text after its tag (all of it for a format without a tag)."""
        if self.tag is None or not self.trigger.startswith(self.tag):
            return self.trigger
        return self.trigger[len(self.tag) :]


HERMES: Final = ToolFormat(
    "hermes", "", "<tool_call>\n", "}\n</tool_call>", "\n", "", "<tool_call>", True
)
LLAMA3_JSON: Final = ToolFormat(
    "llama3_json", "", "", "}", ";", "", "<|python_tag|>", False, "parameters",
    prefix="<|python_tag|>",
)  # fmt: skip
MISTRAL: Final = ToolFormat(
    "mistral", "[TOOL_CALLS][", "", "}", ", ", "]", "[TOOL_CALLS]", True, id_length=9,
    tag_space=True,
)  # fmt: skip
MISTRAL_V11: Final = ToolFormat(
    "mistral_v11", "", "[TOOL_CALLS]", "", "", "", "[TOOL_CALLS]", True, "", id_length=9,
    args_tag="[ARGS]", shown_markers=True,
)  # fmt: skip
HARMONY: Final = ToolFormat(
    "harmony", "", "<|channel|>commentary to=functions.", "", "", "", "<|channel|>", True, "",
    args_tag=" <|constrain|>json<|message|>", tokens=("<|constrain|>", "<|message|>"),
    parallel=False, answer_header="<|channel|>final<|message|>", shown_markers=True,
)  # fmt: skip
GRANITE: Final = ToolFormat("granite", "<|tool_call|>[", "", "}", ", ", "]", "<|tool_call|>", True)
PYTHONIC: Final = ToolFormat("pythonic", "[", "", ")", ", ", "]", None, False, "")
FORMATS: Final[dict[str, ToolFormat]] = {
    f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL, MISTRAL_V11, GRANITE, PYTHONIC, HARMONY)
}

# What each family's published template says, most specific first.
_SIGNS: Final = (
    (HARMONY, re.compile(r"<\|channel\|>commentary|to=functions\.")),
    (MISTRAL_V11, re.compile(r"\[TOOL_CALLS\].{0,80}\[ARGS\]", re.DOTALL)),
    (MISTRAL, re.compile(r"\[TOOL_CALLS\]")),
    (GRANITE, re.compile(r"<\|tool_call\|>")),
    (HERMES, re.compile(r"<tool_call>")),
    (PYTHONIC, re.compile(r"func_name1\(params?_name1=")),
    (LLAMA3_JSON, re.compile(r"<\|python_tag\|>|\"parameters\": dictionary")),
)


def format_named(name: str | None) -> ToolFormat:
    """The format called ``name`` (None: Hermes); ConstraintError naming the known ones."""
    if name is None:
        return HERMES
    try:
        return FORMATS[name]
    except KeyError:
        known = ", ".join(FORMATS)
        raise ConstraintError(f"unknown tool format {name!r} (known: {known})") from None


def detect_format(template: str | Mapping[str, str] | None) -> ToolFormat:
    """The tool-call syntax a chat template teaches (named templates: all of them read);
    Hermes when it names none."""
    if isinstance(template, Mapping):
        template = "\n".join(str(t) for t in template.values())
    for fmt, sign in _SIGNS:
        if template and sign.search(template):
            return fmt
    return HERMES


def model_format(tokenizer: Any, name: str | None = None) -> ToolFormat:
    """The manifest's ``name`` when set, else the one the tokenizer's chat template teaches."""
    if name is not None:
        return format_named(name)
    return detect_format(getattr(tokenizer, "chat_template", None))


# -- pythonic arguments ----------------------------------------------------------------------


def python_literal(value: Any) -> str:
    """A JSON value as Python writes it (strings in JSON's double quotes, valid in both)."""
    if value is True:
        return "True"
    if value is False:
        return "False"
    if value is None:
        return "None"
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(k)}: {python_literal(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    return json.dumps(value)


def _value(schema: Any, defs: dict[str, Any]) -> str:
    """Lark for one argument's value as a Python literal. Booleans, None, enums, consts and
    unions of them are Python's; any other value is JSON (llguidance's %json, whose strings,
    numbers, lists and objects are Python literals too; nested true/false/null read back)."""
    if isinstance(schema, dict):
        if "const" in schema:
            return json.dumps(python_literal(schema["const"]))
        if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
            return "(" + " | ".join(json.dumps(python_literal(v)) for v in schema["enum"]) + ")"
        for union in ("anyOf", "oneOf"):
            if isinstance(schema.get(union), list) and len(schema) == 1 + ("title" in schema):
                return "(" + " | ".join(_value(s, defs) for s in schema[union]) + ")"
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return "(" + " | ".join(_value({**schema, "type": k}, defs) for k in kind) + ")"
        if kind == "boolean":
            return '("True" | "False")'
        if kind == "null":
            return '"None"'
    body = {**schema, **defs} if isinstance(schema, dict) else schema
    if isinstance(body, dict):
        body = {**body, "x-guidance": dict(JSON_OPTIONS)}
    return f"%json {json.dumps(body, allow_nan=False)}"


def python_arguments(rule: str, schema: dict[str, Any]) -> tuple[str, list[str]]:
    """The Lark expression for the keyword arguments of a call and its rules (named
    ``rule_*``): the schema's properties in its order, each required one present, separated
    by ", ". ConstraintError for a property name that is not a Python identifier."""
    props: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    defs: dict[str, Any] = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    missing = required - set(props)
    if missing:
        raise ConstraintError(f"required argument {sorted(missing)[0]!r} has no property")
    names = list(props)
    if not names:
        return "", []
    lines = []
    for i, name in enumerate(names):
        if not IDENTIFIER.fullmatch(name):
            raise ConstraintError(
                f"argument {name!r} is not a Python identifier (pythonic tool format)"
            )
        lines.append(f"{rule}_kv{i}: {json.dumps(name + '=')} {_value(props[name], defs)}")
    # first_i: arguments i.. with none written yet; rest_i: the same after one was written
    n = len(names)
    for i in range(n - 1, -1, -1):
        kv, later = f"{rule}_kv{i}", (f" {rule}_rest{i + 1}" if i + 1 < n else "")
        if names[i] in required:
            if i:
                lines.append(f'{rule}_rest{i}: ", " {kv}{later}')
            lines.append(f"{rule}_first{i}: {kv}{later}")
        else:
            if i:
                lines.append(f'{rule}_rest{i}: (", " {kv})?{later}')
            skip = f" | {rule}_first{i + 1}" if i + 1 < n else ""
            lines.append(f"{rule}_first{i}: {kv}{later}{skip}")
    return f"{rule}_first0" + ("" if required else "?"), lines


__all__ = [
    "FORMATS",
    "GRANITE",
    "HARMONY",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "MISTRAL_V11",
    "PYTHONIC",
    "ToolFormat",
    "detect_format",
    "format_named",
    "model_format",
    "python_arguments",
    "python_literal",
]
