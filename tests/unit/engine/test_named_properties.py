"""Schemas as frameworks send them (constraints/objects.py): an object that names its
properties and says nothing of others generates only those; where closing could forbid what
a sibling allows, the schema is left as written; every output the closed schema permits is
valid under the original."""

from __future__ import annotations

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine.constraints.json_schema import ConstraintError, compile_json_grammar
from gateway.engine.constraints.objects import named_properties_only
from tests.support.models import build_tokenizer

# What pydantic 2 emits for `class Person(BaseModel): name: str; age: int` with a nested
# model and a list of them: no additionalProperties anywhere.
PYDANTIC = {
    "$defs": {
        "Pet": {
            "properties": {"kind": {"title": "Kind", "type": "string"}},
            "required": ["kind"],
            "title": "Pet",
            "type": "object",
        }
    },
    "properties": {
        "name": {"title": "Name", "type": "string"},
        "age": {"title": "Age", "type": "integer"},
        "pets": {"items": {"$ref": "#/$defs/Pet"}, "title": "Pets", "type": "array"},
    },
    "required": ["name", "age"],
    "title": "Person",
    "type": "object",
}


def test_a_pydantic_schema_allows_only_its_named_properties() -> None:
    closed = named_properties_only(PYDANTIC)
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["Pet"]["additionalProperties"] is False
    assert "additionalProperties" not in PYDANTIC  # a copy: the client's schema unchanged
    extra = {"name": "Ann", "age": 3, " or ": "x"}
    jsonschema.validate(extra, PYDANTIC)  # valid by the letter of JSON Schema...
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(extra, closed)  # ...and no longer generated
    pet = {"name": "Ann", "age": 3, "pets": [{"kind": "cat", "legs": 4}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pet, closed)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
        {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
        {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}},
        {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False},
        {"type": "object", "properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]},
        {"type": "object", "properties": {"a": {}}, "$ref": "#/$defs/x", "$defs": {"x": {}}},
        {"type": "object"},  # names nothing: says nothing about which keys
    ],
)
def test_a_schema_that_speaks_of_other_keys_is_left_as_written(schema) -> None:
    assert named_properties_only(schema) == schema


def test_the_members_of_an_allof_stay_open_so_that_their_union_is_still_possible() -> None:
    schema = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    closed = named_properties_only(schema)
    jsonschema.validate({"a": 1, "b": 2}, closed)  # closing each member would forbid this
    inside = {"type": "object", "properties": {"x": {"allOf": [{"$ref": "#/$defs/P"}]}},
              "$defs": {"P": {"type": "object", "properties": {"k": {}}}}}  # fmt: skip
    closed = named_properties_only(inside)
    assert closed["additionalProperties"] is False
    assert closed["$defs"]["P"]["additionalProperties"] is False  # referenced, not a member


def test_a_schema_over_the_size_limits_is_refused_before_it_is_walked() -> None:
    deep: dict = {"type": "object"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ConstraintError):
        named_properties_only(deep)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
_schemas = st.recursive(
    st.sampled_from([{}, {"type": "string"}, {"type": "integer"}, {"type": "object"}]),
    lambda inner: (
        st.builds(
            lambda props, extra: {"type": "object", "properties": props, **extra},
            st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
            st.sampled_from([{}, {"additionalProperties": True}, {"required": ["a"]}]),
        )
        | st.builds(lambda xs: {"allOf": xs}, st.lists(inner, min_size=1, max_size=2))
        | st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=2))
        | st.builds(lambda x: {"type": "array", "items": x}, inner)
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(schema=_schemas, doc=_json)
def test_whatever_the_closed_schema_accepts_the_original_accepts(schema, doc) -> None:
    if jsonschema.Draft202012Validator(named_properties_only(schema)).is_valid(doc):
        jsonschema.validate(doc, schema)


def test_the_grammar_offers_no_unnamed_key_unless_the_request_opens_objects() -> None:
    """After every named property the closed grammar allows only the closing brace; the
    schema as written allows a comma and another key."""
    tok = build_tokenizer()
    vocab = len(tok)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    def allowed_after(s: dict, text: str) -> set[str]:
        g = compile_json_grammar(tok, s, vocab).new()
        for t in tok(text, add_special_tokens=False)["input_ids"]:
            g.consume(t)
        mask = g.allowed_mask(vocab)
        return {tok.decode([i]) for i in torch.nonzero(mask).flatten().tolist()}

    closed = allowed_after(named_properties_only(schema), '{"n":1')
    opened = allowed_after(schema, '{"n":1')
    assert not any(s.startswith(",") for s in closed)
    assert any(s.startswith(",") for s in opened)
