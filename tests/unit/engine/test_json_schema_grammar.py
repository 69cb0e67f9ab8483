"""JsonGrammar on its own: masks, rollback (llguidance pitfalls 1 and 2), schema errors, the
compile cache and validate_output. Tokenizer: the tiny byte-level BPE of conftest.py."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine import EngineError
from gateway.engine.constraints import json_schema as js
from gateway.engine.constraints.json_schema import (
    ConstraintError,
    JsonGrammar,
    compile_json_grammar,
    validate_output,
)
from gateway.engine.constraints.schema_checks import unknown_keywords
from tests.support.models import build_tokenizer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
DOC = '{"name":"héllo","age":42,"tags":["a","bc"]}'

TOKENIZER = build_tokenizer()  # module-level: hypothesis tests cannot take fixtures
V = len(TOKENIZER)
EOS = TOKENIZER.eos_token_id


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def fresh(schema=PERSON, vocab: int = V) -> JsonGrammar:
    return compile_json_grammar(TOKENIZER, schema, vocab).new()


def walk(tokens: list[int], schema=PERSON) -> JsonGrammar:
    g = fresh(schema)
    for t in tokens:
        assert bool(g.allowed_mask(V)[t]), f"token {t} should be allowed"
        g.consume(t)
    return g


def random_walk(g: JsonGrammar, steps: int, gen: torch.Generator) -> list[int]:
    """Consume up to `steps` random allowed non-EOS tokens; returns them."""
    out: list[int] = []
    for _ in range(steps):
        mask = g.allowed_mask(V)
        mask[EOS] = False
        choices = mask.nonzero().flatten()
        if not choices.numel():
            break
        t = int(choices[torch.randint(len(choices), (1,), generator=gen)])
        g.consume(t)
        out.append(t)
    return out


# -- masks ---------------------------------------------------------------------------------


def test_a_valid_document_walks_through_and_completes() -> None:
    doc = ids(DOC)
    g = fresh()
    for i, t in enumerate(doc):
        assert not g.is_complete(), f"complete too early at {i}"
        mask = g.allowed_mask(V)
        assert mask.dtype == torch.bool and mask.shape == (V,)
        assert bool(mask[t])
        g.consume(t)
    assert g.is_complete()
    assert bool(g.allowed_mask(V)[EOS])


def test_masks_forbid_what_breaks_the_schema() -> None:
    g = walk(ids('{"name":"ab","age":'))
    mask = g.allowed_mask(V)
    allowed_text = {TOKENIZER.decode([int(t)]) for t in mask.nonzero().flatten()}
    assert allowed_text and all(s[0].isdigit() for s in allowed_text)  # no '-', no quote
    assert not g.is_complete()
    g2 = walk(ids('{"name":"abcdef'))  # maxLength 6 reached: only the closing quote
    assert {TOKENIZER.decode([int(t)]) for t in g2.allowed_mask(V).nonzero().flatten()} <= {
        '"',
        '",',
    }


def test_mask_bits_agree_with_llguidance_token_by_token() -> None:
    """The bitmask unpacking: mask[t] == llguidance's own verdict on t, for every token."""
    for prefix in ("", '{"name":"h', '{"name":"ab","age":1', '{"name":"ab","age":1}'):
        g = walk(ids(prefix))
        mask = g.allowed_mask(V)
        verdicts = [g._m.validate_tokens([t]) == 1 for t in range(V)]
        verdicts[EOS] = g.is_complete()  # validate_tokens never accepts EOS
        assert mask.tolist() == verdicts, prefix
        assert 0 < int(mask.sum()) < V


def test_mask_padded_for_a_larger_model_vocabulary() -> None:
    g = fresh(vocab=V + 9)
    mask = g.allowed_mask(V + 9)
    assert mask.shape == (V + 9,) and not bool(mask[V:].any())
    assert torch.equal(mask[:V], fresh().allowed_mask(V))
    assert torch.equal(g.allowed_mask(V - 1), mask[: V - 1])


def test_masks_are_cached_per_state_and_returned_as_copies() -> None:
    doc = ids(DOC)[:6]
    g = fresh()
    first = g.allowed_mask(V)
    first[:] = False  # a caller that edits the mask in place must not poison the cache
    assert torch.equal(g.allowed_mask(V), fresh().allowed_mask(V))
    assert g.mask_computations == 1
    for t in doc:  # draft walk
        g.allowed_mask(V)
        g.consume(t)
    g.rollback(len(doc))
    before = g.mask_computations
    for t in doc:  # verify walk over the same draft: every mask is a cache hit
        g.allowed_mask(V)
        g.consume(t)
    assert g.mask_computations == before


def test_forbidden_token_raises_and_leaves_the_state_intact() -> None:
    """Pitfall 2: a forbidden token must never reach the matcher (error state forever)."""
    prefix = ids('{"name":"ab","age":')
    g = walk(prefix)
    before = g.allowed_mask(V)
    quote = ids('"')[0]
    assert not bool(before[quote])
    with pytest.raises(ValueError, match="not allowed"):
        g.consume(quote)
    with pytest.raises(ValueError):
        g.consume(V + 3)  # outside the vocabulary
    g2 = walk(prefix)  # no mask asked first: consume checks with validate_tokens
    with pytest.raises(ValueError):
        g2.consume(quote)
    for grammar in (g, g2):
        assert grammar.consumed == tuple(prefix)
        assert torch.equal(grammar.allowed_mask(V), before)
        rest = ids('7,"tags":[]}')
        for t in rest:
            grammar.consume(t)
        assert grammar.is_complete()


# -- rollback ------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 24), data=st.data())
def test_rollback_equals_a_fresh_grammar_on_the_kept_tokens(seed, steps, data) -> None:
    gen = torch.Generator().manual_seed(seed)
    g = fresh()
    walked = random_walk(g, steps, gen)
    back = data.draw(st.integers(0, len(walked)), label="rollback")
    g.rollback(back)
    kept = walked[: len(walked) - back]
    ref = walk(kept)
    assert g.consumed == tuple(kept)
    assert torch.equal(g.allowed_mask(V), ref.allowed_mask(V))
    assert g.is_complete() == ref.is_complete()
    # and the two keep agreeing on a new continuation
    more = random_walk(g, 6, gen)
    for t in more:
        assert bool(ref.allowed_mask(V)[t])
        ref.consume(t)
    assert torch.equal(g.allowed_mask(V), ref.allowed_mask(V))


def test_eos_after_completion_is_tracked_for_rollback() -> None:
    """Pitfall 1: llguidance does not count an EOS consumed after completion; rolling it
    back must not undo the closing brace too."""
    doc = ids(DOC)
    g = walk(doc)
    g.consume(EOS)
    assert g.consumed == (*doc, EOS)
    assert g.is_complete() and not bool(g.allowed_mask(V).any())  # nothing after EOS
    with pytest.raises(ValueError):
        g.consume(ids("a")[0])
    with pytest.raises(ValueError):
        g.consume(EOS)
    g.rollback(1)
    assert g.is_complete()
    assert torch.equal(g.allowed_mask(V), walk(doc).allowed_mask(V))
    g.consume(EOS)
    g.rollback(2)  # EOS and the closing brace
    ref = walk(doc[:-1])
    assert not g.is_complete()
    assert torch.equal(g.allowed_mask(V), ref.allowed_mask(V))


def test_eos_before_completion_is_refused() -> None:
    g = walk(ids('{"name":"a"'))
    with pytest.raises(ValueError, match="EOS"):
        g.consume(EOS)
    assert g.consumed == tuple(ids('{"name":"a"'))


def test_rollback_bounds() -> None:
    g = walk(ids('{"na'))
    with pytest.raises(ValueError):
        g.rollback(len(g.consumed) + 1)
    with pytest.raises(ValueError):
        g.rollback(-1)
    g.rollback(0)
    g.rollback(len(g.consumed))
    assert torch.equal(g.allowed_mask(V), fresh().allowed_mask(V))


# -- schema errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "names"),
    [
        ({"type": "strnig"}, "strnig"),
        ([{"type": "object"}], "must be a JSON object"),
        ("string", "must be a JSON object"),
        (True, "must be a JSON object"),
        ({"type": "string", "maxLenght": 3}, "maxLenght"),  # a typo is not ignored
        ({"properties": {"a": {"type": "string", "nullable": True}}}, "#/properties/a/nullable"),
        ({"type": "array", "contains": {"type": "integer"}}, "contains"),  # unimplemented
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"not": {"type": "string"}}, "not"),
        ({"type": "string", "format": "no-such-format"}, "no-such-format"),
        ({"type": "integer", "minimum": 5, "maximum": 3}, "minimum"),
        ({"type": "string", "minLength": "x"}, "minLength"),
        ({"$ref": "#/$defs/missing"}, "missing"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
        ({"type": "object", "default": {1, 2}}, "not plain JSON"),
    ],
)
def test_bad_schemas_raise_constraint_error_naming_the_problem(schema, names) -> None:
    with pytest.raises(ConstraintError) as info:
        compile_json_grammar(TOKENIZER, schema, V)
    assert names in str(info.value)
    assert isinstance(info.value, EngineError)


@pytest.mark.parametrize(
    "options", [{"lenient": True}, {"coerce_one_of": True}, {"item_separator": "x"}]
)
def test_x_guidance_cannot_change_llguidance_options(options) -> None:
    schema = {"x-guidance": options, "type": "array", "items": {"type": "integer"}}
    with pytest.raises(ConstraintError, match="x-guidance"):
        compile_json_grammar(TOKENIZER, schema, V)
    assert js.JSON_OPTIONS["lenient"] is False and js.JSON_OPTIONS["coerce_one_of"] is False


def test_unknown_keywords_walks_subschemas_not_property_names() -> None:
    schema = {
        "type": "object",
        "properties": {"maxLenght": {"type": "string"}, "b": {"items": [{"tpye": "x"}]}},
        "$defs": {"d": {"anyOf": [{"x-note": 1}, {"bogus": 2}]}},
        "x-vendor": {"anything": True},
        "items": {"x-guidance": {}},
    }
    assert unknown_keywords(schema) == [
        "#/properties/b/items/0/tpye",
        "#/$defs/d/anyOf/1/bogus",
        "#/items/x-guidance",
    ]


def test_annotations_and_supported_keywords_compile() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "t",
        "description": "d",
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date", "examples": ["2020-01-01"]},
            "n": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5},
            "pair": {"type": "array", "prefixItems": [{"const": 1}, {"type": "boolean"}]},
            "ref": {"$ref": "#/$defs/x"},
        },
        "$defs": {"x": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^a+$"}]}},
    }
    g = compile_json_grammar(TOKENIZER, schema, V).new()
    assert bool(g.allowed_mask(V)[ids("{")[0]])


# -- cache ---------------------------------------------------------------------------------


def test_compiling_the_same_schema_twice_returns_the_cached_grammar() -> None:
    a = compile_json_grammar(TOKENIZER, PERSON, V)
    reordered = json.loads(json.dumps(PERSON, sort_keys=True))
    assert compile_json_grammar(TOKENIZER, PERSON, V) is a
    assert compile_json_grammar(TOKENIZER, reordered, V) is a
    assert compile_json_grammar(TOKENIZER, PERSON, V + 1) is not a
    assert compile_json_grammar(build_tokenizer(), PERSON, V) is not a
    assert compile_json_grammar(TOKENIZER, None, V) is compile_json_grammar(TOKENIZER, None, V)
    g1, g2 = a.new(), a.new()
    g1.consume(ids("{")[0])
    assert g2.consumed == () and a.new().consumed == ()


def test_cache_is_bounded_lru(monkeypatch) -> None:
    monkeypatch.setattr(js, "GRAMMAR_CACHE_SIZE", 2)
    schemas = [{"type": "object", "maxProperties": n} for n in range(3)]
    first = compile_json_grammar(TOKENIZER, schemas[0], V)
    compile_json_grammar(TOKENIZER, schemas[1], V)
    assert compile_json_grammar(TOKENIZER, schemas[0], V) is first  # refreshed
    compile_json_grammar(TOKENIZER, schemas[2], V)  # evicts schemas[1]
    assert compile_json_grammar(TOKENIZER, schemas[0], V) is first


# -- validate_output -----------------------------------------------------------------------


def test_validate_output() -> None:
    validate_output(DOC, PERSON)
    validate_output('{"x": [1, 2]}', None)
    cases = [
        ('{"name":"ab"}', PERSON, "'age' is a required property"),
        ('{"name":"abcdefgh","age":1}', PERSON, "$.name"),
        ('{"name":"a","age":1,"zzz":0}', PERSON, "zzz"),
        ('{"name":"a","age":1,', PERSON, "not valid JSON"),
        ("[1, 2]", None, "not an object"),
        ("nope", None, "not valid JSON"),
        ('"2020-13-45"', {"type": "string", "format": "date"}, "date"),
    ]
    for text, schema, names in cases:
        with pytest.raises(ConstraintError) as info:
            validate_output(text, schema)
        assert names in str(info.value), str(info.value)


# -- size limits ----------------------------------------------------------------------------


def _nested(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_a_schema_nested_too_deep_is_refused_by_name(tokenizer) -> None:
    """300 levels once escaped as a RecursionError (a 500); now a ConstraintError (a 400)."""
    from gateway.engine.constraints.json_schema import ConstraintError, compile_json_grammar

    with pytest.raises(ConstraintError, match="nests deeper than"):
        compile_json_grammar(tokenizer, _nested(300), len(tokenizer))
    compile_json_grammar(tokenizer, _nested(8), len(tokenizer))  # a reasonable depth compiles


def test_a_schema_with_too_many_values_is_refused(tokenizer) -> None:
    from gateway.engine.constraints.json_schema import ConstraintError, compile_json_grammar
    from gateway.limits import MAX_SCHEMA_NODES

    wide = {"type": "string", "enum": [f"v{i}" for i in range(MAX_SCHEMA_NODES)]}
    with pytest.raises(ConstraintError, match="more than"):
        compile_json_grammar(tokenizer, wide, len(tokenizer))
