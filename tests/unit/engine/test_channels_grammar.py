"""ChannelsFirst (constraints/reasoning.py): gpt-oss's optional analysis message, free up to
its ``<|end|>``, then the inner grammar in a message of its own: after the forced
``<|start|>assistant<|channel|>final<|message|>`` for an inner grammar that writes no header
(response_format), or its own header (tool calls, which begin with ``<|channel|>`` as the
analysis header does: the opening is told apart token by token). A cap on the thinking;
rollback restores every phase exactly (what speculation needs)."""

from __future__ import annotations

import random

import pytest
import torch

from gateway.engine.constraints.base import next_token_mask
from gateway.engine.constraints.reasoning import Channels, ChannelsFirst
from gateway.engine.constraints.token_list import TokenSequencesGrammar

V, CH, MSG, END, START, EOS = 60, 50, 51, 52, 53, 59
ANALYSIS, ASSISTANT, FINAL = (1, 2), 3, 4  # the texts' tokens
C = Channels(
    analysis=(CH, *ANALYSIS, MSG), end=END, start=(START, ASSISTANT), final=(CH, FINAL, MSG),
    channel=CH,
)  # fmt: skip
JSON = [[5, 6, 7], [5, 8]]  # an answer grammar that writes no header
CALLS = [[CH, 1, 9, 10], [CH, 11, MSG, 12]]  # calls: their own header, sharing CH, 1


def fresh(inner: list[list[int]] | None = JSON, budget: int | None = None) -> ChannelsFirst:
    return ChannelsFirst(TokenSequencesGrammar(inner) if inner else None, C, budget)


def allowed(g: ChannelsFirst) -> set[int]:
    return set(torch.nonzero(next_token_mask(g, V, (EOS,), torch.device("cpu"))).flatten().tolist())


def feed(g: ChannelsFirst, *tokens: int) -> ChannelsFirst:
    for t in tokens:
        assert t in allowed(g), (t, allowed(g))
        g.consume(t)
    return g


def test_an_answer_grammar_gets_the_final_header_with_or_without_thinking() -> None:
    g = fresh()
    assert allowed(g) == {CH}
    feed(g, CH)
    assert allowed(g) == {ANALYSIS[0], FINAL}  # analysis, or the final message at once
    feed(g, FINAL)
    assert allowed(g) == {MSG}
    feed(g, MSG, 5, 8)
    assert allowed(g) == {EOS} and g.is_complete()
    g = feed(fresh(), *C.analysis)
    assert allowed(g) == set(range(V)) - {EOS}  # thinking: anything but the output's end
    feed(g, 5, CH, 9, END)
    for t in (START, ASSISTANT, CH, FINAL, MSG):  # then the answer's header is forced
        assert allowed(g) == {t} and not g.is_complete()
        g.consume(t)
    feed(g, 5, 6, 7)
    assert g.is_complete()


def test_calls_write_their_own_header_told_apart_from_the_analysis_token_by_token() -> None:
    g = feed(fresh(CALLS), CH)
    assert allowed(g) == {1, 11}  # the analysis header and the calls share CH, then 1
    feed(g, 1)
    assert allowed(g) == {ANALYSIS[1], 9}
    feed(g, 9, 10)  # a call, no thinking
    assert g.is_complete() and g.inner.consumed == (CH, 1, 9, 10)  # type: ignore[union-attr]
    g = feed(fresh(CALLS), *C.analysis, 7, END)
    assert allowed(g) == {START}
    feed(g, START, ASSISTANT)  # no final header: the call writes its own
    assert allowed(g) == {CH}
    feed(g, CH, 11, MSG, 12)
    assert g.is_complete() and g.inner.consumed == (CH, 11, MSG, 12)  # type: ignore[union-attr]


def test_the_cap_forces_the_end_after_the_budget() -> None:
    g = feed(fresh(budget=2), *C.analysis, 7, 8)
    assert allowed(g) == {END}
    feed(g, END, START)
    assert allowed(g) == {ASSISTANT}


def test_without_an_inner_grammar_only_the_cap_holds() -> None:
    g = fresh(None, budget=1)
    assert allowed(g) == set(range(V))  # any output, the empty one included
    feed(g, *C.analysis, 7)
    assert allowed(g) == {END}
    feed(g, END)
    assert allowed(g) == set(range(V)) and g.is_complete()


def _state(g: ChannelsFirst) -> tuple:
    inner = g.inner.consumed if isinstance(g.inner, TokenSequencesGrammar) else None
    return g.phase, list(g.opened), g.pos, g.thought, inner, frozenset(allowed(g))


@pytest.mark.parametrize("seed", range(30))
def test_rollback_restores_exactly_the_state_after_the_kept_tokens(seed: int) -> None:
    """Random walks with random rollbacks, compared with a grammar that consumed only the
    kept tokens from scratch."""
    rng = random.Random(seed)
    inner, budget = rng.choice([JSON, CALLS, None]), rng.choice([None, 2, 4])
    g, kept = fresh(inner, budget), []
    for _ in range(30):
        options = sorted(allowed(g) - {EOS})
        if not options:
            break
        # lean towards the frame's tokens so that every phase is walked through
        frame = [t for t in options if t in (CH, MSG, END, START, 1, 2, 3, 4, 9, 11)]
        token = rng.choice(frame if frame and rng.random() < 0.7 else options)
        g.consume(token)
        kept.append(token)
        if rng.random() < 0.3:
            n = rng.randint(0, len(kept))
            g.rollback(n)
            kept = kept[: len(kept) - n]
        replay = fresh(inner, budget)
        for t in kept:
            replay.consume(t)
        assert _state(g) == _state(replay), kept


def test_rolling_back_more_than_was_consumed_is_refused() -> None:
    g = feed(fresh(), CH)
    with pytest.raises(ValueError):
        g.rollback(2)
