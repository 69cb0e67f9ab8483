"""The tool-call grammar at the token level, on the tiny BPE with the opening tag as text
and as one added token: free text in auto mode, a forced call once the tag is written, no
text in required mode, and the reader that turns the output back into calls."""

from __future__ import annotations

import random

import pytest

from gateway.engine.constraints.tool_calls import ToolError, ToolSpec, compile_tool_grammar
from gateway.serving.tool_output import ToolCallReader, read_calls
from tests.integration.tiny_models import tokenizer

ADD = ToolSpec(
    "add",
    {
        "type": "object",
        "properties": {"a": {"type": "integer", "maximum": 9}},
        "required": ["a"],
        "additionalProperties": False,
    },
)
CITY = ToolSpec("city", {"type": "object", "properties": {"n": {"type": "string"}}})
CALL = '<tool_call>\n{"name":"add","arguments":{"a":3}}\n</tool_call>'


@pytest.fixture(params=[(), ("<tool_call>",)], ids=["tag_as_text", "tag_as_token"])
def tok(request: pytest.FixtureRequest) -> object:
    return tokenizer(request.param)


def _accepts(tok: object, mode: str, text: str, parallel: bool = True) -> tuple[bool, bool]:
    """(every token allowed, complete at the end) for ``text`` under the grammar."""
    grammar = compile_tool_grammar(tok, [ADD, CITY], mode, parallel, len(tok)).new()  # type: ignore[arg-type]
    for t in tok.encode(text, add_special_tokens=False):  # type: ignore[attr-defined]
        if not grammar.allowed_mask(len(tok))[t]:  # type: ignore[arg-type]
            return False, False
        grammar.consume(t)
    return True, grammar.is_complete()


def test_auto_allows_text_and_forces_a_call_once_opened(tok: object) -> None:
    assert _accepts(tok, "auto", "def add(a, b): no call here") == (True, True)
    assert _accepts(tok, "auto", CALL) == (True, True)
    assert _accepts(tok, "auto", "x " + CALL + "\n" + CALL) == (True, True)
    assert _accepts(tok, "auto", CALL + "\n" + CALL, parallel=False)[0] is False
    assert _accepts(tok, "auto", '<tool_call>\n{"name":"nope"')[0] is False  # unknown tool
    assert _accepts(tok, "auto", CALL.replace("3", "30"))[0] is False  # maximum 9
    assert _accepts(tok, "auto", CALL + " and some text")[0] is False


def test_required_allows_calls_only(tok: object) -> None:
    assert _accepts(tok, "required", "hello")[0] is False
    assert _accepts(tok, "required", CALL) == (True, True)
    assert _accepts(tok, "required", CALL[:-3]) == (True, False)


def test_bad_tools_name_their_index() -> None:
    tok = tokenizer()
    bad = [
        ([ADD, ToolSpec("add", ADD.parameters)], 1, "name"),
        ([ADD, ToolSpec("b c", {"type": "object"})], 1, "name"),
        ([ToolSpec("s", {"type": "string"})], 0, "parameters"),
        ([ToolSpec("k", {"type": "object", "propertiez": {}})], 0, "parameters"),
    ]
    for tools, index, field in bad:
        with pytest.raises(ToolError) as exc:
            compile_tool_grammar(tok, tools, "auto", True, len(tok))
        assert (exc.value.index, exc.value.field) == (index, field)


def test_reader_streamed_in_any_pieces_equals_whole() -> None:
    text = 'hi <tool_call>\n{"name":"add","arguments":{"s":"}\\n"}}\n</tool_call>\n' + CALL[:-9]
    content, calls = read_calls(text)
    assert content == "hi " and [c.name for c in calls] == ["add", "add"]
    assert calls[0].arguments == '{"s":"}\\n"}' and calls[0].complete
    assert calls[1].arguments == '{"a":3}' and not calls[1].complete  # cut in the closing
    for seed in range(100):
        rng, reader, i = random.Random(seed), ToolCallReader(), 0
        events = []
        while i < len(text):
            j = i + rng.randint(1, 6)
            events += reader.feed(text[i:j])
            i = j
        events += reader.finish()
        assert (reader.content, reader.calls) == (content, calls)
        args = "".join(e[2] for e in events if e[0] == "arguments" and e[1] == 0)  # type: ignore[misc]
        assert args == calls[0].arguments
