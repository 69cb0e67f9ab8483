"""Tool-call formats by family, at the token level: the format read off each family's
template (or named by the manifest), the grammar of each format (forced calls, parallel
calls, the lazy trigger in auto mode, the tag as text and as one added token), random walks
through each grammar on the demo tokenizer giving calls valid against their schemas, and
the one reader per format agreeing with itself however a stream is cut."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from transformers import AutoTokenizer

from gateway.engine.constraints.json_schema import ConstraintError
from gateway.engine.constraints.tool_calls import ToolError, ToolSpec, compile_tool_grammar
from gateway.engine.constraints.tool_formats import (
    FORMATS,
    detect_format,
    format_named,
    python_literal,
)
from gateway.serving.tool_output import (
    ToolCallReader,
    check_calls,
    format_of,
    python_arguments_json,
    read_calls,
)
from models_registry.errors import ManifestError
from models_registry.manifest import TOOL_FORMATS, load_manifest
from tests.integration import tiny_models
from tests.integration.tool_families import SPECIAL_TAGS, TAGS, TEMPLATES

DEMO = Path(__file__).parents[3] / "models_registry" / "demo" / "demo-code-target-v1"
ADD = ToolSpec(
    "add",
    {
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["a"],
        "additionalProperties": False,
    },
)
CITY = ToolSpec(
    "city",
    {
        "type": "object",
        "properties": {
            "n": {"type": "string", "maxLength": 6},
            "hot": {"type": "boolean"},
            "unit": {"enum": ["c", "f"]},
            "note": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
        },
        "required": ["n"],
        "additionalProperties": False,
    },
)
SCHEMAS = {"add": ADD.parameters, "city": CITY.parameters}
# One call of each tool per format, as its grammar writes them.
CALLS = {
    "hermes": (
        '<tool_call>\n{"name":"add","arguments":{"a":3}}\n</tool_call>',
        '<tool_call>\n{"name":"city","arguments":{"n":"Paris","hot":true}}\n</tool_call>',
    ),
    "llama3_json": (
        '{"name":"add","parameters":{"a":3}}',
        '{"name":"city","parameters":{"n":"Paris","hot":true}}',
    ),
    "mistral": (
        '[TOOL_CALLS][{"name":"add","arguments":{"a":3}}]',
        '{"name":"city","arguments":{"n":"Paris","hot":true}}',
    ),
    "mistral_v11": (
        '[TOOL_CALLS]add[ARGS]{"a":3}',
        '[TOOL_CALLS]city[ARGS]{"n":"Paris","hot":true}',
    ),
    "granite": (
        '<|tool_call|>[{"name":"add","arguments":{"a":3}}]',
        '{"name":"city","arguments":{"n":"Paris","hot":true}}',
    ),
    "pythonic": ("[add(a=3)]", 'city(n="Paris", hot=True)'),
}
LISTS = [f for f in FORMATS if FORMATS[f].parallel]
"""The formats whose outputs may hold several calls (all but harmony, whose one call ends
its output: tests/unit/serving/test_harmony.py)."""


def two_calls(fmt: str) -> str:
    """Both calls of CALLS in ``fmt``, as one parallel output."""
    first, second = CALLS[fmt]
    f = FORMATS[fmt]
    if f.end:  # the list's end moves after the second call
        return first[: -len(f.end)] + f.separator + second + f.end
    return first + f.separator + second


def _accepts(
    tok: Any, fmt: str, mode: str, text: str, parallel: bool = True, drop: int = 0
) -> tuple[bool, bool]:
    """(every token allowed, complete at the end) for ``text`` less its last ``drop`` tokens
    under the grammar."""
    compiled = compile_tool_grammar(tok, [ADD, CITY], mode, parallel, len(tok), fmt)  # type: ignore[arg-type]
    grammar = compiled.new()
    ids = tok.encode(text, add_special_tokens=False)
    for t in ids[: len(ids) - drop]:
        if not grammar.allowed_mask(len(tok))[t]:
            return False, False
        grammar.consume(t)
    return True, grammar.is_complete()


@pytest.fixture(scope="module", params=[False, True], ids=["tags_as_text", "tags_as_tokens"])
def tok(request: pytest.FixtureRequest) -> Any:
    return tiny_models.tokenizer(TAGS if request.param else ())


def test_each_family_template_names_its_format() -> None:
    for name, template in TEMPLATES.items():
        assert detect_format(template).name == name
        assert detect_format({"default": "x", "tool_use": template}).name == name
    assert detect_format(tiny_models.CHAT_TEMPLATE).name == "hermes"  # the demo's ChatML
    assert detect_format(None).name == detect_format("{{ messages }}").name == "hermes"
    demo = AutoTokenizer.from_pretrained(DEMO)
    assert compile_tool_grammar(demo, [ADD], "auto", True, len(demo)).schema["format"] == "hermes"


def test_the_manifest_names_a_format_or_is_refused(tmp_path: Path) -> None:
    assert tuple(FORMATS) == TOOL_FORMATS  # the registry's names are the engine's
    entry = {"name": "t", "version": "1", "role": "target", "path": "t", "sha256": "0" * 64}
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": [{**entry, "tool_format": "granite"}]}))
    loaded = load_manifest(path)
    assert loaded.entries[0].tool_format == "granite"
    assert loaded.to_dict()["models"][0]["tool_format"] == "granite"
    path.write_text(yaml.safe_dump({"models": [{**entry, "tool_format": "xml"}]}))
    with pytest.raises(ManifestError, match="tool_format"):
        load_manifest(path)
    # the manifest's name wins over the template's; an unknown one is the tools' 400
    demo = AutoTokenizer.from_pretrained(DEMO)
    compiled = compile_tool_grammar(demo, [ADD], "required", False, len(demo), "pythonic")
    assert compiled.schema == {"tools": {"add": ADD.parameters}, "format": "pythonic"}
    assert format_of(compiled.schema).name == "pythonic"
    with pytest.raises(ToolError, match="unknown tool format"):
        compile_tool_grammar(demo, [ADD], "required", False, len(demo), "xml")
    with pytest.raises(ConstraintError):
        format_named("xml")


@pytest.mark.parametrize("fmt", LISTS)
def test_required_forces_calls_in_the_format(tok: Any, fmt: str) -> None:
    one, both = CALLS[fmt][0], two_calls(fmt)
    assert _accepts(tok, fmt, "required", one) == (True, True)
    assert _accepts(tok, fmt, "required", both) == (True, True)
    assert _accepts(tok, fmt, "required", both, parallel=False)[0] is False
    assert _accepts(tok, fmt, "required", "hello")[0] is False
    assert _accepts(tok, fmt, "required", one.replace("3", "30"))[0] is False  # maximum 9
    assert _accepts(tok, fmt, "required", one.replace("add", "sub"))[0] is False  # unknown
    assert _accepts(tok, fmt, "required", one, drop=1) == (True, False)
    if fmt != "hermes":  # the other formats' calls never carry Hermes' wrapper
        assert _accepts(tok, fmt, "required", CALLS["hermes"][0])[0] is False


@pytest.mark.parametrize("fmt", LISTS)
def test_auto_allows_text_and_triggers_on_the_formats_opening(tok: Any, fmt: str) -> None:
    one, both = CALLS[fmt][0], two_calls(fmt)
    assert _accepts(tok, fmt, "auto", "def add(a, b): no call here") == (True, True)
    assert _accepts(tok, fmt, "auto", one) == (True, True)
    assert _accepts(tok, fmt, "auto", both) == (True, True)
    assert _accepts(tok, fmt, "auto", one + " and some text")[0] is False
    assert _accepts(tok, fmt, "auto", one.replace("3", "30"))[0] is False
    if FORMATS[fmt].anywhere:  # text, then the opening tag forces a call
        assert _accepts(tok, fmt, "auto", "let me see: " + one) == (True, True)
    else:  # the calls start the output: text may not start like one
        start = one[0]
        assert _accepts(tok, fmt, "auto", start + " not a call")[0] is False
        assert _accepts(tok, fmt, "auto", "a text, then " + start) == (True, True)
    if fmt == "llama3_json":
        assert _accepts(tok, fmt, "auto", "<|python_tag|>" + one) == (True, True)


def test_mistral_takes_the_tag_with_and_without_a_space(tok: Any) -> None:
    """Mistral v0.3 writes ``[TOOL_CALLS] [``, later Mistral models ``[TOOL_CALLS][``."""
    spaced = two_calls("mistral").replace("[TOOL_CALLS][", "[TOOL_CALLS] [")
    for mode in ("required", "auto"):
        assert _accepts(tok, "mistral", mode, spaced) == (True, True)
        # two spaces: refused, or (the tag as text, auto) never a complete output
        assert _accepts(tok, "mistral", mode, spaced.replace("] [", "]  [")) != (True, True)
    assert _accepts(tok, "granite", "required", "<|tool_call|> [")[0] is False
    mistral = FORMATS["mistral"]
    assert read_calls("ok " + spaced, mistral)[1] == read_calls(two_calls("mistral"), mistral)[1]
    assert read_calls("ok [TOOL_CALLS]  [", mistral) == ("ok [TOOL_CALLS]  [", [])


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_random_walks_through_a_forced_grammar_give_valid_calls(fmt: str) -> None:
    """Any path the mask allows on the demo tokenizer (its own chat template swapped for the
    family's) ends in calls that name a tool and validate against its schema."""
    demo = AutoTokenizer.from_pretrained(DEMO)
    demo.chat_template = TEMPLATES[fmt]
    compiled = compile_tool_grammar(demo, [ADD, CITY], "required", True, len(demo))
    assert compiled.schema["format"] == fmt  # read off the template
    rng = random.Random(fmt)
    eos = demo.eos_token_id
    for _ in range(4):
        grammar = compiled.new()
        ids: list[int] = []
        while not grammar.is_complete() or (len(ids) < 40 and rng.random() < 0.8):
            allowed = grammar.allowed_mask(len(demo)).nonzero().flatten().tolist()
            choices = [t for t in allowed if t != eos] or allowed
            if len(ids) > 200 and grammar.is_complete():
                break
            token = rng.choice(choices)
            if token == eos:
                break
            grammar.consume(token)
            ids.append(token)
        text = str(demo.decode(ids))
        content, calls = read_calls(text, FORMATS[fmt])
        assert content == "" and calls and all(c.complete for c in calls), text
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        check_calls(text, SCHEMAS, FORMATS[fmt])


@pytest.mark.parametrize("fmt", ["llama3_json", "mistral", "granite"])
def test_a_special_tag_is_read_from_what_follows_it(fmt: str) -> None:
    """Llama's, Mistral's and Granite's tags are special tokens, which the output's text
    (decoded without them, as the engine does) does not show: the calls are still read."""
    tok = tiny_models.tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(SPECIAL_TAGS)})
    compiled = compile_tool_grammar(tok, [ADD, CITY], "auto", True, len(tok), fmt)
    assert compiled.schema["hidden_tag"] is True
    hidden = format_of(compiled.schema)
    assert hidden.hidden_tag and hidden.name == fmt
    tag = tok.convert_tokens_to_ids(FORMATS[fmt].tag)
    for prefix, space in (("", ""), ("Sure. " if hidden.anywhere else "", " ")):
        if space and not hidden.tag_space:
            continue
        grammar = compiled.new()
        calls = two_calls(fmt).removeprefix(FORMATS[fmt].tag or "")
        ids = [*tok.encode(prefix, add_special_tokens=False), tag]
        ids += tok.encode(space + calls, add_special_tokens=False)
        for t in ids:
            assert grammar.allowed_mask(len(tok))[t], tok.decode([t])
            grammar.consume(t)
        assert grammar.is_complete()
        text = tok.decode(ids, skip_special_tokens=True)
        assert FORMATS[fmt].tag not in text
        content, calls = read_calls(text, hidden)
        assert (content, [c.name for c in calls]) == (prefix, ["add", "city"])
        check_calls(text, SCHEMAS, hidden)


@pytest.mark.parametrize("fmt", LISTS)
def test_one_reader_per_format_streamed_in_any_pieces_equals_whole(fmt: str) -> None:
    f = FORMATS[fmt]
    text = ("I will check. " if f.anywhere else "") + two_calls(fmt)
    content, calls = read_calls(text, f)
    assert content == ("I will check. " if f.anywhere else "")
    assert [c.name for c in calls] == ["add", "city"] and all(c.complete for c in calls)
    assert [json.loads(c.arguments) for c in calls] == [{"a": 3}, {"n": "Paris", "hot": True}]
    for seed in range(60):
        rng, reader, i, events = random.Random(seed), ToolCallReader(f), 0, []
        while i < len(text):
            j = i + rng.randint(1, 5)
            events += reader.feed(text[i:j])
            i = j
        events += reader.finish()
        assert (reader.content, reader.calls) == (content, calls)
        assert "".join(e[1] for e in events if e[0] == "content") == content  # type: ignore[misc]
        for index, call in enumerate(calls):
            parts = [e[2] for e in events if e[0] == "arguments" and e[1] == index]  # type: ignore[misc]
            assert "".join(parts) == call.arguments
    assert read_calls(text[:-4], f)[1][-1].complete is False  # cut short


def test_text_that_only_looks_like_an_opening_stays_text() -> None:
    assert read_calls("a [TOOL_CALLS", FORMATS["mistral"]) == ("a [TOOL_CALLS", [])
    assert read_calls("<|python_ta", FORMATS["llama3_json"]) == ("<|python_ta", [])
    assert read_calls("plain [x]", FORMATS["pythonic"]) == ("plain [x]", [])
    assert read_calls("", FORMATS["pythonic"]) == ("", [])


def test_pythonic_arguments_read_back_as_json() -> None:
    args = 's="})]", b=True, n=None, l=[1, -2.5, {"x": false}], t=(1,), q=\'it\\\'s\''
    assert json.loads(python_arguments_json(args)) == {
        "s": "})]", "b": True, "n": None, "l": [1, -2.5, {"x": False}], "t": [1], "q": "it's",
    }  # fmt: skip
    assert python_arguments_json("") == "{}"
    for bad in ("x=open('f')", "1, 2", "x=y"):
        with pytest.raises(ConstraintError):
            python_arguments_json(bad)
    assert python_literal({"a": [True, None, "x"]}) == '{"a": [True, None, "x"]}'


def test_pythonic_needs_identifier_arguments() -> None:
    tok = tiny_models.tokenizer()
    bad = ToolSpec("f", {"type": "object", "properties": {"first-name": {"type": "string"}}})
    with pytest.raises(ToolError) as exc:
        compile_tool_grammar(tok, [ADD, bad], "required", True, len(tok), "pythonic")
    assert exc.value.index == 1 and "identifier" in str(exc.value)
    empty = ToolSpec("now", {"type": "object"})
    assert _accepts_with(tok, [empty], "[now()]") == (True, True)


def _accepts_with(tok: Any, tools: list[ToolSpec], text: str) -> tuple[bool, bool]:
    grammar = compile_tool_grammar(tok, tools, "required", True, len(tok), "pythonic").new()
    for t in tok.encode(text, add_special_tokens=False):
        if not grammar.allowed_mask(len(tok))[t]:
            return False, False
        grammar.consume(t)
    return True, grammar.is_complete()
