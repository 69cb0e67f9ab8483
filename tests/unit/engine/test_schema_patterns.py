"""Schema regexes (issue 44): RE2 matches them in linear time, the limits refuse what RE2
cannot run or what is too long, and the RE2 validator agrees with jsonschema's own (Python
re) wherever both run. Negative control: the old validator takes exponential time on the
attack pattern, which the timing test here would catch."""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine.constraints.json_schema import compile_json_grammar, validate_output
from gateway.engine.constraints.patterns import MAX_PATTERN_CHARS, MAX_PATTERNS_CHARS
from gateway.engine.constraints.schema_checks import (
    ConstraintError,
    check_enforceable,
    check_patterns,
    schema_patterns,
)
from tests.support.models import build_tokenizer

EVIL = r"^(?:(a|a)*[^\s\S]|a{%d})$"


def _string(pattern: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": pattern}},
        "required": ["s"],
    }


def test_the_attack_pattern_validates_in_linear_time() -> None:
    validate_output(json.dumps({"s": "a"}), _string("a"))  # imports, caches
    t0 = time.perf_counter()
    validate_output(json.dumps({"s": "a" * 40}), _string(EVIL % 40))
    with pytest.raises(ConstraintError, match="does not match"):
        validate_output(json.dumps({"s": "a" * 39}), _string(EVIL % 40))
    assert time.perf_counter() - t0 < 0.1


def test_negative_control_python_re_takes_exponential_time() -> None:
    """The old validator (jsonschema with Python's re) on the same pattern: each letter
    doubles its time, so 40 letters would take hours; 20 already take measurable time."""
    times = []
    for letters in (14, 20):
        schema = _string(EVIL % letters)
        t0 = time.perf_counter()
        jsonschema.Draft202012Validator(schema).is_valid({"s": "a" * letters})
        times.append(time.perf_counter() - t0)
    assert times[1] > 10 * times[0] and times[1] > 0.02, times


def test_schema_patterns_walks_schema_positions_only() -> None:
    schema = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "pattern": "^x$"},  # a property named pattern
            "list": {"type": "array", "items": {"type": "string", "pattern": "^y$"}},
        },
        "patternProperties": {"^z": {"type": "string"}},
        "anyOf": [{"pattern": "^w$"}],
        "$defs": {"d": {"pattern": "^v$"}},
    }
    found = dict(schema_patterns(schema))
    assert found == {
        "#/properties/pattern/pattern": "^x$",
        "#/properties/list/items/pattern": "^y$",
        "#/patternProperties/^z": "^z",
        "#/anyOf/0/pattern": "^w$",
        "#/$defs/d/pattern": "^v$",
    }


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (r"(a)\1", "not supported"),  # a backreference
        (r"(?=a)a", "not supported"),  # look-ahead
        ("a" * (MAX_PATTERN_CHARS + 1), "at most"),
        ("a{1001}", "not supported"),  # RE2's repetition limit
    ],
)
def test_patterns_refused(pattern: str, message: str) -> None:
    with pytest.raises(ConstraintError, match=message):
        check_patterns(_string(pattern))


def test_patterns_refused_by_their_total() -> None:
    each = "a" * MAX_PATTERN_CHARS
    props = {f"p{i}": {"type": "string", "pattern": each} for i in range(11)}
    assert 11 * MAX_PATTERN_CHARS > MAX_PATTERNS_CHARS
    with pytest.raises(ConstraintError, match="in all"):
        check_patterns({"type": "object", "properties": props})


def test_compile_refuses_what_re2_cannot_run() -> None:
    tok = build_tokenizer()
    with pytest.raises(ConstraintError, match="at most"):
        check_enforceable(_string("a" * (MAX_PATTERN_CHARS + 1)))
    with pytest.raises(ConstraintError):
        compile_json_grammar(tok, _string("a" * (MAX_PATTERN_CHARS + 1)), len(tok))


def test_pattern_properties_and_additional_properties() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^x": {"type": "integer"}, "^y": {"type": "string"}},
        "additionalProperties": False,
    }
    validate_output('{"xa": 1, "yb": "s"}', schema)
    with pytest.raises(ConstraintError, match="not of type"):
        validate_output('{"xa": "s"}', schema)
    with pytest.raises(ConstraintError, match="regexes"):
        validate_output('{"z": 1}', schema)
    nested = {"type": "object", "additionalProperties": {"type": "string", "pattern": "^a+$"}}
    validate_output('{"k": "aa"}', nested)
    with pytest.raises(ConstraintError, match="does not match"):
        validate_output('{"k": "b"}', nested)


PATTERNS = ["^a+$", "b", "^[a-c]{2,3}$", "^(ab|c)*$", r"^\d+$", "x|y", "^$"]


@settings(max_examples=200, deadline=None)
@given(
    pattern=st.sampled_from(PATTERNS),
    key_pattern=st.sampled_from(PATTERNS),
    value=st.text("abcxy12", max_size=6),
    key=st.text("abcxy12", max_size=4),
    closed=st.booleans(),
)
def test_agrees_with_jsonschema_where_python_re_is_safe(
    pattern: str, key_pattern: str, value: str, key: str, closed: bool
) -> None:
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": pattern}},
        "patternProperties": {key_pattern: {"type": "string"}},
        "additionalProperties": not closed,
    }
    doc = {"s": value, key: value}
    expected = jsonschema.Draft202012Validator(schema).is_valid(doc)
    try:
        validate_output(json.dumps(doc), schema)
        got = True
    except ConstraintError:
        got = False
    assert got == expected, (schema, doc)


def _many(n: int, width: int = 900) -> dict[str, Any]:
    """n distinct 12-character regexes, each a large RE2 program (a few ms to compile)."""
    props = {f"p{i}": {"type": "string", "pattern": f"[^a]{{1,{width + i}}}"} for i in range(n)}
    return {"type": "object", "properties": props}


def test_a_schema_of_costly_regexes_is_refused_within_its_budget() -> None:
    """Under the character limits, hundreds of short regexes that each compile for
    milliseconds (with the interpreter lock held) would stall every thread for seconds:
    the count and the compile budget refuse them in about a tenth of a second."""
    t0 = time.perf_counter()
    with pytest.raises(ConstraintError, match=r"ms to compile|more than 64 regexes"):
        check_patterns(_many(800))
    assert time.perf_counter() - t0 < 0.5
    with pytest.raises(ConstraintError, match="more than 64 regexes"):
        check_patterns(_many(65, width=1))  # cheap ones, but too many
    check_patterns(_many(8, width=50))  # a handful of real formats compile in time


def test_a_regex_past_re2s_memory_budget_is_refused_quickly() -> None:
    """`\\pL{400}` (any letter, 400 times) is a program RE2 compiled for about 200 ms
    under its default 8 MiB; under RE2_MAX_MEM it is refused in milliseconds."""
    t0 = time.perf_counter()
    with pytest.raises(ConstraintError, match="too large"):
        check_patterns(_string(r"\pL{400}"))
    assert time.perf_counter() - t0 < 0.1
