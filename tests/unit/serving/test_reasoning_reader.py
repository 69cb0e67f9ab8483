"""The reasoning split (gateway/serving/reasoning.py): one reader for streams and whole
outputs, so both agree however the text is cut; partial tags held back; token counts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.engine.constraints.reasoning import Markers
from gateway.serving.reasoning import Reasoning, ReasoningReader, reasoning_tokens, split

THINKS = Reasoning(markers=None, inside=False)
INSIDE = Reasoning(markers=None, inside=True)


@pytest.mark.parametrize(
    ("text", "reasoning", "want"),
    [
        ('<think>\nadd them\n</think>\n\n{"a":1}', THINKS, ("\nadd them\n", '{"a":1}')),
        ("<think>x</think>", THINKS, ("x", "")),
        ("  <think>x</think>y", THINKS, ("x", "y")),  # leading whitespace before the tag
        ("no thinking here", THINKS, (None, "no thinking here")),
        ("<thin", THINKS, (None, "<thin")),  # cut short while it could still be the tag
        ("<think>cut short", THINKS, ("cut short", "")),
        ("<think>a</thi", THINKS, ("a</thi", "")),
        ("already thinking</think>answer", INSIDE, ("already thinking", "answer")),
        ("answer", None, (None, "answer")),  # not a thinking model: untouched
        ("<think>a</think>b</think>", THINKS, ("a", "b</think>")),  # one end tag only
    ],
)
def test_split(text: str, reasoning: Reasoning | None, want: tuple) -> None:
    assert split(text, reasoning) == want


pieces = st.text(alphabet="<>/thinkab\n {}", max_size=40)


@given(text=pieces, cuts=st.lists(st.integers(0, 40), max_size=8), inside=st.booleans())
def test_a_stream_cut_anywhere_reads_as_the_whole_text(text, cuts, inside) -> None:
    reader = ReasoningReader(inside=inside)
    events = []
    at = 0
    for cut in sorted(c for c in cuts if c <= len(text)):
        events += reader.feed(text[at:cut])
        at = cut
    events += reader.feed(text[at:])
    events += reader.finish()
    thought = "".join(t for k, t in events if k == "reasoning")
    content = "".join(t for k, t in events if k == "content")
    whole_thought, whole_content = split(text, Reasoning(None, inside))
    assert thought == (whole_thought or "")
    assert content == whole_content


def test_reasoning_tokens_count_up_to_the_end_tag() -> None:
    r = Reasoning(Markers(start=100, end=101), inside=False)
    assert reasoning_tokens([100, 5, 6, 101, 7], r) == 4
    assert reasoning_tokens([100, 5, 6], r) == 3  # cut before the end: all thinking
    assert reasoning_tokens([7, 8], r) == 0  # answered without thinking
    assert reasoning_tokens([5, 101, 7], Reasoning(r.markers, inside=True)) == 2
    assert reasoning_tokens([100, 5], None) == 0
