"""Prompt prefixes kept in free slots and reused by the next request of the same scope.

A row that leaves its batch leaves the keys and values of its committed context (prompt
and output, all but the last token) in its slot. They stay valid until the slot is
written again, so the batch notes them (`Kept`: a scope and the tokens). When a request
joins (`place`), the free slot whose kept tokens share the longest prefix with its prompt
lends it that prefix: at least MIN_REUSE tokens, at most all but the prompt's last token
(which the row's first step feeds), copied into the row's slot when it lies in another,
and the row's prefill starts after it. A chat's next turn, or a second request with the
same system prompt, then prefills only what is new.

Rows keep slots 0..n-1 (scheduler.py `_leave`), so a joining row takes the lowest free
slot, and a leaving row's slot is overwritten by the row moved into it. Before either
happens, a kept prefix that would be lost is copied into another free slot (`_save`):
one whose note is empty first, else the least recently used one. So a batch of 16 slots
serving one client keeps its last 15 distinct prompts, not just the last one.

Only the scope that computed a prefix reuses it (the serving layer passes the tenant): a
reused prefix answers sooner, and the time to first token would otherwise tell one
tenant what another sent. A request without a scope neither reuses nor leaves anything.

Numerics: reused keys and values were computed by earlier forwards (other chunks, other
rows beside them, the decode steps of an earlier output), so logits may differ from a
fresh prefill's in the last bits, as they do between batch compositions (scheduler.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.engine.batch.slots import SlotCache

MIN_REUSE = 16  # tokens: a shorter common prefix (a shared BOS, a chat template's head) is
# not worth the bookkeeping; it prefills in well under a millisecond


@dataclass
class Kept:
    """What a free slot holds: `tokens`' keys and values, computed for `scope`."""

    scope: str
    tokens: tuple[int, ...]
    used: int  # the batch's counter when it was kept or last lent: the least recent goes


class PrefixCache:
    """The notes of one SlotCache's free slots (a batch's target cache, or a draft's:
    batch/drafting.py)."""

    def __init__(self, cache: SlotCache, min_reuse: int = MIN_REUSE) -> None:
        self.cache = cache
        self.min_reuse = max(1, min_reuse)
        self.kept: dict[int, Kept] = {}
        self._clock = 0

    def take(self, scope: str | None, prompt: Sequence[int]) -> tuple[int, int]:
        """The lowest free slot for a request of `prompt`, and the prompt tokens already in
        it (`place`); a lend that raises gives the slot back."""
        slot = self.cache.take()
        try:
            return slot, self.place(slot, scope, prompt)
        except BaseException:  # a failed copy must not leave the slot taken for good
            self.cache.release(slot)
            raise

    def keep(self, slot: int, scope: str | None, tokens: Sequence[int]) -> None:
        """Note that free `slot` holds `tokens`' keys and values (positions 0..n-1), as far
        as its cache lends them (`SlotCache.reusable`)."""
        self.kept.pop(slot, None)
        tokens = tokens[: self.cache.reusable(slot, len(tokens))]
        if scope is None or not self._worth(tokens):
            return
        kept = Kept(scope, tuple(tokens), self._tick())
        for s in [s for s, k in self.kept.items() if _covers(kept, k)]:
            del self.kept[s]  # the new note covers it: that slot is free for another
        self.kept[slot] = kept

    def place(self, slot: int, scope: str | None, prompt: Sequence[int]) -> int:
        """`slot` was just taken for a request of `prompt`: lend it the longest kept prefix
        of its scope (copied in when it lies in another slot), saving the prefix the slot
        held if it is not the one lent. Sets and returns the slot's length: the prompt
        tokens already there."""
        best, reuse = None, 0
        prompt = tuple(prompt)
        limit = len(prompt) - 1
        if scope is not None and limit >= self.min_reuse:
            for s, k in self.kept.items():
                if k.scope == scope:
                    n = _common(k.tokens, prompt, limit)
                    if n > reuse or (n == reuse and s == slot):  # in place: no copy
                        best, reuse = s, n
        if reuse < self.min_reuse:
            best, reuse = None, 0
        own = self.kept.pop(slot, None)
        if own is not None and best != slot:
            self._save(slot, own, avoid=best)
        if best is not None and best != slot:
            self.cache.copy_prefix(best, slot, reuse)
        if best is not None and best in self.kept:
            self.kept[best].used = self._tick()
        self.cache.length[slot] = reuse
        return reuse

    def leaving(self, slot: int, scope: str | None, tokens: Sequence[int]) -> None:
        """A leaving row's slot is about to be overwritten (another row moves into it):
        keep its tokens' keys and values in another free slot."""
        tokens = tokens[: self.cache.reusable(slot, len(tokens))]
        if scope is not None and self._worth(tokens):
            self._save(slot, Kept(scope, tuple(tokens), self._tick()), avoid=None)

    def _worth(self, tokens: Sequence[int]) -> bool:
        """Whether `tokens` are worth a note: enough of them, and buffers holding them."""
        return len(tokens) >= self.min_reuse and self.cache.allocated

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _save(self, src: int, kept: Kept, avoid: int | None) -> None:
        """Copy `kept` (in slot `src`) into another free slot: an unnoted one first, else the
        least recently used one; dropped when there is none."""
        free = [s for s in self.cache.free if s != src and s != avoid]
        if not free or any(_covers(k, kept) for s, k in self.kept.items() if s != src):
            return  # nowhere to go, or another slot holds it already
        empty = [s for s in free if s not in self.kept]
        if empty:
            dst = min(empty)
        else:
            dst = min(free, key=lambda s: self.kept[s].used)
            if self.kept[dst].used > kept.used:  # everything else was used more recently
                return
        self.cache.copy_prefix(src, dst, len(kept.tokens))
        self.kept[dst] = kept


def _covers(a: Kept, b: Kept) -> bool:
    """Whether note a makes note b redundant: the same scope, b's tokens a prefix of a's."""
    n = len(b.tokens)
    return a.scope == b.scope and len(a.tokens) >= n and a.tokens[:n] == b.tokens


def _common(a: tuple[int, ...], b: tuple[int, ...], limit: int) -> int:
    """The length of a's and b's common prefix, at most `limit`."""
    n = min(len(a), len(b), limit)
    if n and a[n - 1] == b[n - 1] and a[:n] == b[:n]:
        return n  # the usual case for a repeated prompt: one comparison of slices
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
