"""Stop strings are matched in time linear in the output (issue 44): the new TextOutput
agrees with the old quadratic one (kept here as the reference) wherever the old one was
chunk-independent, is itself independent of how the text is cut into pieces, and its
per-step cost does not grow with the stop strings' length. The negative control times
the old reference under the same attack and shows the cost test would catch it."""

from __future__ import annotations

import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.engine.detok import TextOutput


class OldTextOutput:
    """The TextOutput of 063ddb8: a held-back tail found by slicing every candidate length."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self._stop = tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self._stop), default=0)
        self.text = ""
        self._streamed = 0
        self.stopped = False

    def add(self, new_text: str) -> None:
        if self.stopped or not new_text:
            return
        start = max(0, len(self.text) - self._max_stop + 1)
        self.text += new_text
        hits = [i for s in self._stop if (i := self.text.find(s, start)) >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def releasable(self) -> str:
        end = len(self.text)
        if not self.stopped:
            end -= self._held_tail()
        out = self.text[self._streamed : end]
        self._streamed = max(self._streamed, end)
        return out

    def _held_tail(self) -> int:
        for n in range(min(self._max_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self._stop):
                return n
        return 0


def _run(out: TextOutput | OldTextOutput, pieces: list[str]) -> tuple[str, list[str], bool]:
    released = []
    for p in pieces:
        out.add(p)
        released.append(out.releasable())
    return out.text, released, out.stopped


def _cut(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 4)
        pieces.append(text[i : i + n])
        i += n
    return pieces


stops_st = st.lists(st.text("ab", min_size=1, max_size=5), min_size=0, max_size=4)


@settings(max_examples=300, deadline=None)
@given(stops=stops_st, text=st.text("abc", max_size=40), seed=st.integers(0, 10**6))
def test_matches_the_old_output_char_by_char_and_any_cut(
    stops: list[str], text: str, seed: int
) -> None:
    chars = list(text)
    new_text, new_released, new_stopped = _run(TextOutput(tuple(stops)), chars)
    old_text, old_released, old_stopped = _run(OldTextOutput(tuple(stops)), chars)
    assert (new_text, new_released, new_stopped) == (old_text, old_released, old_stopped)
    # any other cut into pieces: the same text, and what was released joins the same way
    out = TextOutput(tuple(stops))
    cut_text, released, stopped = _run(out, _cut(text, random.Random(seed)))
    assert (cut_text, stopped) == (new_text, new_stopped)
    assert "".join(released) + out.release_all() == new_text


def _attack_seconds(cls: type, steps: int, stop_len: int) -> float:
    """Seconds for `steps` one-token steps of 'aaa' against four long stop strings (a
    distinct first letter, then 'a' * (stop_len - 1)): no tail of the text is a prefix of
    any, which the old check learned by trying every length."""
    stops = tuple(c + "a" * (stop_len - 1) for c in "wxyz")
    out = cls(stops)
    t0 = time.perf_counter()
    for _ in range(steps):
        out.add("aaa")
        out.releasable()
    return time.perf_counter() - t0


def test_per_step_cost_does_not_grow_with_the_stop_length() -> None:
    short = _attack_seconds(TextOutput, 2000, 16)
    long = _attack_seconds(TextOutput, 2000, 1024)
    assert long < max(5 * short, 0.05), (short, long)  # KMP: O(new characters) per step


def test_negative_control_the_old_tail_check_grows_with_the_stop_length() -> None:
    """The cost test above catches the old behaviour: per step the old check slices every
    candidate tail length, so 1,024-character stops cost far more than 16-character ones."""
    short = _attack_seconds(OldTextOutput, 300, 16)
    long = _attack_seconds(OldTextOutput, 300, 1024)
    assert long >= max(5 * short, 0.05), (short, long)
