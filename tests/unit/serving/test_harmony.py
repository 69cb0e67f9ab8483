"""gpt-oss's harmony channels on the tiny tokenizer with its markers as special tokens (as in
gpt-oss's tokenizer) and a template modelled on gpt-oss's (tests/integration/
tool_families.py): the convention and the tool format read off the template; the output's
text with its markers written back (serving/shown.py) split into reasoning and content, in
full and however a stream is cut; a call read from its commentary message; the grammar
that leaves the analysis free and holds the final answer to a schema or forces a call; the
thinking's tokens counted. Negative controls: the engine's text without the markers has no
reasoning and no call in it."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest

from gateway.engine.constraints.json_schema import compile_json_grammar
from gateway.engine.constraints.tool_calls import ToolSpec, compile_tool_grammar
from gateway.engine.constraints.tool_formats import FORMATS, HARMONY, detect_format
from gateway.serving.reasoning import detect, grammar, reasoning_tokens, split
from gateway.serving.shown import ShownText, markers_of
from gateway.serving.tool_output import read_calls
from tests.integration import tiny_models
from tests.integration.tool_families import GPT_OSS, QWEN
from tests.integration.tool_families import HARMONY as MARKERS

PERSON = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["age"],
    "additionalProperties": False,
}
ADD = ToolSpec("add", {"type": "object", "properties": {"a": {"type": "integer"}},
                       "required": ["a"], "additionalProperties": False})  # fmt: skip


@pytest.fixture(scope="module")
def tok() -> Any:
    tok = tiny_models.tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(MARKERS)})
    tok.chat_template = GPT_OSS
    return tok


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _shown(tok: Any, ids: list[int]) -> str:
    reasoning = detect(tok, "")
    assert reasoning is not None
    text = tok.decode(ids, skip_special_tokens=True)
    return ShownText(tok, markers_of(None, reasoning)).feed(text, ids)


THINK_THEN_ANSWER = (
    "<|channel|>analysis<|message|>The user wants an age.<|end|><|start|>assistant"
    '<|channel|>final<|message|>{"age":7}<|return|>'
)
THINK_THEN_CALL = (
    "<|channel|>analysis<|message|>Need add.<|end|><|start|>assistant to=functions.add"
    '<|channel|>commentary <|constrain|>json<|message|>{"a":3}<|call|>'
)


def test_the_template_names_harmony_for_reasoning_and_tools(tok: Any) -> None:
    hi = [{"role": "user", "content": "hi"}]
    reasoning = detect(tok, tok.apply_chat_template(hi, tokenize=False, add_generation_prompt=True))
    assert reasoning is not None and reasoning.harmony and reasoning.channels is not None
    assert {m for _, m in reasoning.shown} == set(MARKERS) - {"<|return|>", "<|call|>"}
    assert detect_format(GPT_OSS) is HARMONY
    other = tiny_models.tokenizer()
    other.chat_template = QWEN
    assert detect(other, "") is None and detect_format(QWEN).name == "hermes"


def test_reasoning_and_answer_come_apart_in_full_and_in_any_pieces(tok: Any) -> None:
    ids = _ids(tok, THINK_THEN_ANSWER)
    reasoning = detect(tok, "")
    shown = _shown(tok, ids)
    assert split(shown, reasoning) == ("The user wants an age.", '{"age":7}')
    engine_text = tok.decode(ids, skip_special_tokens=True)  # the negative control
    assert split(engine_text, reasoning) == (None, engine_text)
    assert "analysis" in engine_text and "final" in engine_text
    for seed in range(40):
        rng, reader, i, events = random.Random(seed), reasoning.reader(), 0, []  # type: ignore[union-attr]
        while i < len(shown):
            j = i + rng.randint(1, 7)
            events += reader.feed(shown[i:j])
            i = j
        events += reader.finish()
        thought = "".join(t for k, t in events if k == "reasoning")
        answer = "".join(t for k, t in events if k == "content")
        assert (thought, answer) == ("The user wants an age.", '{"age":7}')
    assert split(_shown(tok, _ids(tok, '<|channel|>final<|message|>Hi')), reasoning) == (
        None, "Hi",
    )  # fmt: skip


def test_a_call_is_read_from_its_commentary_message_whatever_its_headers_order(tok: Any) -> None:
    reasoning = detect(tok, "")
    for text in (THINK_THEN_CALL, THINK_THEN_CALL.replace(
        "assistant to=functions.add<|channel|>commentary ",
        "assistant<|channel|>commentary to=functions.add ",
    )):  # fmt: skip
        thought, content = split(_shown(tok, _ids(tok, text)), reasoning)
        assert thought == "Need add."
        rest, calls = read_calls(content, HARMONY)
        assert rest == "" and [(c.name, c.arguments, c.complete) for c in calls] == [
            ("add", '{"a":3}', True)
        ]
    engine_text = tok.decode(_ids(tok, THINK_THEN_CALL), skip_special_tokens=True)
    assert read_calls(split(engine_text, reasoning)[1], HARMONY)[1] == []  # negative control


def _walk(g: Any, tok: Any, ids: list[int]) -> None:
    for t in ids:
        assert g.allowed_mask(len(tok))[t], repr(tok.decode([t]))
        g.consume(t)


def test_the_schema_holds_the_final_answer_and_the_analysis_stays_free(tok: Any) -> None:
    reasoning = detect(tok, "")
    inner = compile_json_grammar(tok, PERSON, len(tok))
    ids = _ids(tok, THINK_THEN_ANSWER)[:-1]  # without <|return|>, which the loop handles
    g = grammar(inner.new(), reasoning, None)
    _walk(g, tok, ids)
    assert g.is_complete()  # type: ignore[union-attr]
    jsonschema.validate(json.loads(split(_shown(tok, ids), reasoning)[1]), PERSON)
    bad = _ids(tok, '<|channel|>final<|message|>{"age":700}')
    g = grammar(inner.new(), reasoning, None)
    with pytest.raises(AssertionError):
        _walk(g, tok, bad)
    # the cap: after 2 thinking tokens only <|end|> may follow, then the answer's header
    g = grammar(inner.new(), reasoning, 2)
    _walk(g, tok, _ids(tok, "<|channel|>analysis<|message|>") + _ids(tok, "ab")[:1] * 2)
    end = tok.convert_tokens_to_ids("<|end|>")
    assert g.allowed_mask(len(tok)).nonzero().flatten().tolist() == [end]  # type: ignore[union-attr]


def test_a_forced_call_follows_the_analysis_and_is_valid(tok: Any) -> None:
    reasoning = detect(tok, "")
    compiled = compile_tool_grammar(tok, [ADD], "required", True, len(tok))
    assert compiled.schema["format"] == "harmony"
    ids = _ids(tok, THINK_THEN_CALL.replace(
        "assistant to=functions.add<|channel|>commentary ",
        "assistant<|channel|>commentary to=functions.add ",
    ))[:-1]  # fmt: skip
    g = grammar(compiled.new(), reasoning, None)
    _walk(g, tok, ids)
    assert g.is_complete()  # type: ignore[union-attr]
    g = grammar(compiled.new(), reasoning, None)  # a call without thinking
    _walk(g, tok, _ids(tok, '<|channel|>commentary to=functions.add <|constrain|>json'
                             '<|message|>{"a":1}'))  # fmt: skip
    assert g.is_complete()  # type: ignore[union-attr]
    g = grammar(compiled.new(), reasoning, None)
    with pytest.raises(AssertionError):  # required: no final answer
        _walk(g, tok, _ids(tok, "<|channel|>final<|message|>hi"))
    auto = compile_tool_grammar(tok, [ADD], "auto", True, len(tok))
    g = grammar(auto.new(), reasoning, None)  # auto: a final answer is allowed
    _walk(g, tok, _ids(tok, "<|channel|>final<|message|>hi there"))
    assert g.is_complete() and not FORMATS["harmony"].parallel  # type: ignore[union-attr]


def test_reasoning_tokens_count_the_analysis_messages(tok: Any) -> None:
    reasoning = detect(tok, "")
    ids = _ids(tok, THINK_THEN_ANSWER)
    thinking = _ids(tok, "<|channel|>analysis<|message|>The user wants an age.<|end|>")
    assert reasoning_tokens(ids, reasoning) == len(thinking)
    assert reasoning_tokens(_ids(tok, "<|channel|>final<|message|>x"), reasoning) == 0
    cut = thinking[:-3]  # cut short inside the thinking: all of it
    assert reasoning_tokens(cut, reasoning) == len(cut)
