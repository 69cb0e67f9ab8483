"""ThinkingFirst (constraints/reasoning.py): free thinking, then the inner grammar; a cap on
the thinking; rollback restores every phase exactly (what speculation needs)."""

from __future__ import annotations

import random

import pytest
import torch

from gateway.engine.constraints.base import next_token_mask
from gateway.engine.constraints.reasoning import Markers, ThinkingFirst
from gateway.engine.constraints.token_list import TokenSequencesGrammar

V, START, END, SPACE, EOS = 40, 30, 31, 32, 39
MARKERS = Markers(START, END, frozenset({SPACE}))
ANSWERS = [[5, 6, 7], [5, 8]]


def fresh(inside: bool = False, budget: int | None = None, inner: bool = True) -> ThinkingFirst:
    g = TokenSequencesGrammar(ANSWERS) if inner else None
    return ThinkingFirst(g, MARKERS, inside, budget)


def allowed(g: ThinkingFirst) -> set[int]:
    return set(torch.nonzero(next_token_mask(g, V, (EOS,), torch.device("cpu"))).flatten().tolist())


def test_the_first_token_is_the_start_tag_or_the_answer() -> None:
    assert allowed(fresh()) == {START, 5}


def test_thinking_is_free_but_cannot_end_the_output_then_the_answer_is_constrained() -> None:
    g = fresh()
    g.consume(START)
    assert allowed(g) == set(range(V)) - {EOS}  # anything, the end tag included; never EOS
    for t in (1, 5, 9, START):  # the thinking may mention anything
        g.consume(t)
    g.consume(END)
    assert allowed(g) == {SPACE, 5}  # whitespace, or the answer's first token
    g.consume(SPACE)
    g.consume(5)
    assert allowed(g) == {6, 8}
    g.consume(8)
    assert allowed(g) == {EOS} and g.is_complete()


def test_a_prompt_that_opened_the_thinking_starts_inside_it() -> None:
    g = fresh(inside=True)
    assert allowed(g) == set(range(V)) - {EOS}
    g.consume(END)
    assert allowed(g) == {SPACE, 5}


def test_the_cap_forces_the_end_tag_after_the_budget() -> None:
    g = fresh(budget=3)
    g.consume(START)
    for t in (1, 2, 3):
        assert END in allowed(g) and len(allowed(g)) > 1
        g.consume(t)
    assert allowed(g) == {END}
    g.consume(END)
    assert allowed(g) == {SPACE, 5}


def test_without_an_inner_grammar_the_answer_is_free_and_the_cap_still_holds() -> None:
    g = fresh(budget=1, inner=False)
    assert allowed(g) == set(range(V))  # answering at once (EOS included) is allowed
    g.consume(START)
    g.consume(4)
    assert allowed(g) == {END}
    g.consume(END)
    assert EOS in allowed(g) and 4 in allowed(g)


def _state(g: ThinkingFirst) -> tuple:
    inner = g.inner.consumed if isinstance(g.inner, TokenSequencesGrammar) else None
    return g.phase, g.thought, inner, frozenset(allowed(g)), g.is_complete()


@pytest.mark.parametrize("seed", range(20))
def test_rollback_restores_exactly_the_state_after_the_kept_tokens(seed: int) -> None:
    """Random walks with random rollbacks, compared with a grammar that consumed only the
    kept tokens from scratch."""
    rng = random.Random(seed)
    inside, budget = rng.random() < 0.3, rng.choice([None, 2, 4])
    g, kept = fresh(inside, budget), []
    for _ in range(30):
        options = sorted(allowed(g) - {EOS})
        if not options:
            break
        token = rng.choice(options)
        g.consume(token)
        kept.append(token)
        if rng.random() < 0.3:
            n = rng.randint(0, len(kept))
            g.rollback(n)
            kept = kept[: len(kept) - n]
        replay = fresh(inside, budget)
        for t in kept:
            replay.consume(t)
        assert _state(g) == _state(replay)


def test_rolling_back_more_than_was_consumed_is_refused() -> None:
    g = fresh()
    g.consume(START)
    with pytest.raises(ValueError):
        g.rollback(2)
