"""Special tokens written back into an output's text (serving/shown.py): Mistral v11's
``[TOOL_CALLS]f[ARGS]{...}`` with both markers special tokens, as in Mistral's tokenizers.
The engine's own output builder makes the deltas (its detokenizer, its stop strings), so the
stream is cut where the engine cuts it."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gateway.engine.constraints.tool_calls import ToolSpec, compile_tool_grammar
from gateway.engine.output import OutputBuilder
from gateway.serving.shown import ShownText, markers_of
from gateway.serving.tool_output import format_of, read_calls
from tests.integration import tiny_models

ADD = ToolSpec("add", {"type": "object", "properties": {"a": {"type": "integer"}}})
CITY = ToolSpec("city", {"type": "object", "properties": {"n": {"type": "string"}}})


@pytest.fixture(scope="module")
def tok() -> Any:
    tok = tiny_models.tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]", "[ARGS]"]})
    return tok


def _ids(tok: Any, *parts: str) -> list[int]:
    """Text pieces and markers (which are single tokens) as token ids."""
    ids: list[int] = []
    for part in parts:
        ids += tok.encode(part, add_special_tokens=False)
    return ids


def _stream(tok: Any, ids: list[int], stop: tuple[str, ...], seed: int) -> tuple[str, list[Any]]:
    """The engine's text and its deltas, the tokens committed in random runs."""
    out = OutputBuilder(tok, (), stop, (tok.eos_token_id,), 1000)
    rng, deltas, i = random.Random(seed), [], 0
    while i < len(ids) and out.finish_reason is None:
        n = rng.randint(1, 4)
        for t in ids[i : i + n]:
            if out.push(t):
                break
        i += n
        if out.finish_reason is None and i >= len(ids):
            out.finish("stop")
        if (d := out.delta()) is not None:
            deltas.append(d)
    return out.text, deltas


def test_mistral_v11_calls_are_read_with_their_special_markers(tok: Any) -> None:
    compiled = compile_tool_grammar(tok, [ADD, CITY], "auto", True, len(tok), "mistral_v11")
    fmt = format_of(compiled.schema)
    ids_of = tok.convert_tokens_to_ids
    assert compiled.schema["shown"] == {m: ids_of(m) for m in ("[TOOL_CALLS]", "[ARGS]")}
    assert "hidden_tag" not in compiled.schema
    ids = _ids(tok, "Sure. ", "[TOOL_CALLS]", "add", "[ARGS]", '{"a":3}', "[TOOL_CALLS]", "city")
    ids += _ids(tok, "[ARGS]", '{"n":"x[y"}')
    grammar = compiled.new()  # the grammar names both markers as their tokens
    for t in ids:
        assert grammar.allowed_mask(len(tok))[t], tok.decode([t])
        grammar.consume(t)
    assert grammar.is_complete()
    markers = markers_of(compiled.schema)
    text = tok.decode(ids, skip_special_tokens=True)
    # the negative control: the engine's text alone has no call in it
    assert "[ARGS]" not in text and read_calls(text, fmt)[1] == []
    shown = ShownText(tok, markers).feed(text, ids)
    content, calls = read_calls(shown, fmt)
    assert content == "Sure. "
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("add", {"a": 3}),
        ("city", {"n": "x[y"}),
    ]
    for seed in range(30):  # a stream, cut anywhere, writes the same text
        engine_text, deltas = _stream(tok, ids, (), seed)
        stream = ShownText(tok, markers)
        assert "".join(stream.feed(d.text, d.token_ids) for d in deltas) == shown
        assert engine_text == text


def test_a_stop_string_cuts_the_shown_text_where_it_cuts_the_engines(tok: Any) -> None:
    markers = {tok.convert_tokens_to_ids("[TOOL_CALLS]"): "[TOOL_CALLS]"}
    ids = _ids(tok, "ab", "[TOOL_CALLS]", "cd", "[TOOL_CALLS]", "ef")
    for stop, expected in (("bc", "a"), ("d", "ab[TOOL_CALLS]c"), ("zz", None)):
        for seed in range(10):
            engine_text, deltas = _stream(tok, ids, (stop,), seed)
            stream = ShownText(tok, markers)
            shown = "".join(stream.feed(d.text, d.token_ids) for d in deltas)
            whole = ShownText(tok, markers).feed(engine_text, ids)
            assert shown == whole
            assert shown == (expected or "ab[TOOL_CALLS]cd[TOOL_CALLS]ef")
