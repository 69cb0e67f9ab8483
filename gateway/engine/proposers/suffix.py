"""Suffix decoding (Oliaro et al. 2024, arXiv 2411.04975): draft from what followed the
longest suffix of the context in earlier text, choosing by frequency.

`SuffixIndex` answers what a suffix tree over a set of token sequences answers, with memory
linear in the tokens it holds:

- match: the longest suffix s of the context (up to `max_match` tokens) that occurs in the
  indexed text with at least one token after it; its occurrences are the suffix tree's node
  for s. Found from the occurrences of the context's last two tokens (or last one, when no
  pair matches), each extended backwards; the latest `max_candidates` are looked at, which
  bounds the work of one proposal whatever a tenant sent.
- speculate: from that node, walk down the continuation tree, at each depth taking the most
  frequent next token among the occurrences still agreeing (ties: the latest occurrence).
  The path probability is the product of count(child) / count(node), as in the paper; the
  walk stops when it falls below `min_prob`, at k tokens, or at `factor * match length`
  tokens (a short match is weak evidence). score = the sum of the path probabilities: the
  expected number of accepted tokens, which picks between indexes.

`SuffixProposer` keeps a local index of the request's own prompt and output so far, and may
read a shared one (a tenant's recent prompts and outputs, kept by the serving layer; never
another tenant's). Each proposal takes the better scoring of the two. Like every proposer it
only changes speed: the verifier keeps exactly the tokens the target would have emitted, and
its one-hot q keeps sampled output exact too.

Threads: an index is not locked. Only the decoding thread may touch it; the serving layer
hands finished sequences over through its own queue and adds them on that thread.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.engine.proposers.base import Proposal

SEP = -1  # between sequences in the index: never equals a token, so no match crosses it


def _pair(a: int, b: int) -> int:
    """One dict key for the token pair (a, b) (token ids are non-negative, < 2**32)."""
    return (a << 32) | b


@dataclass(frozen=True)
class SuffixParams:
    """max_match: longest suffix matched (the tree's depth); max_candidates: latest
    occurrences looked at per proposal; min_prob: stop drafting below this path
    probability; factor: draft at most ceil(factor * match length) tokens."""

    max_match: int = 32
    max_candidates: int = 128
    min_prob: float = 0.1
    factor: float = 1.0


@dataclass(frozen=True)
class Speculation:
    """tokens: the draft; score: sum of their path probabilities; match: suffix length."""

    tokens: tuple[int, ...] = ()
    score: float = 0.0
    match: int = 0


NOTHING = Speculation()


class SuffixIndex:
    """Token sequences with the positions of every token and token pair, oldest first.

    `add` appends a whole sequence and, past `budget_tokens`, evicts the oldest ones (a
    sequence longer than the budget keeps its last `budget_tokens` tokens). `extend` grows
    the open last sequence (a request's own context). Memory: a few machine words per token
    held; `tokens` and `entries` say how many."""

    def __init__(self, budget_tokens: int | None = None, params: SuffixParams | None = None):
        if budget_tokens is not None and budget_tokens < 1:
            raise ValueError("a suffix index needs a budget of at least one token")
        self.budget_tokens = budget_tokens
        self.params = params or SuffixParams()
        self._toks: list[int] = []  # the sequences, each closed one followed by SEP
        self._base = 0  # global position of _toks[0] (positions survive eviction)
        self._lengths: deque[int] = deque()  # closed sequences' lengths, SEP included
        self._one: dict[int, deque[int]] = {}  # token -> its global positions
        self._two: dict[int, deque[int]] = {}  # pair -> global positions of its 2nd token

    @property
    def tokens(self) -> int:
        """Tokens held (separators excluded)."""
        return len(self._toks) - len(self._lengths)

    @property
    def sequences(self) -> int:
        return len(self._lengths)

    @property
    def entries(self) -> int:
        """Positions held in the token and pair maps (at most two per token)."""
        return sum(map(len, self._one.values())) + sum(map(len, self._two.values()))

    # -- building -------------------------------------------------------------------------

    def add(self, tokens: Sequence[int]) -> None:
        """Index one finished sequence; evict the oldest past the budget."""
        seq = list(tokens)
        if self.budget_tokens is not None:
            seq = seq[-self.budget_tokens :]
        if not seq:
            return
        self._append(seq)
        self._append([SEP])
        self._lengths.append(len(seq) + 1)
        while self.budget_tokens is not None and self.tokens > self.budget_tokens:
            self._evict_oldest()

    def extend(self, tokens: Iterable[int]) -> None:
        """Grow the open last sequence (no budget: a request's context is bounded)."""
        self._append(list(tokens))

    def _append(self, seq: list[int]) -> None:
        start = self._base + len(self._toks)
        prev = self._toks[-1] if self._toks else SEP
        self._toks.extend(seq)
        for i, tok in enumerate(seq, start):
            if tok != SEP:
                self._one.setdefault(tok, deque()).append(i)
                if prev != SEP:
                    self._two.setdefault(_pair(prev, tok), deque()).append(i)
            prev = tok

    def _evict_oldest(self) -> None:
        n = self._lengths.popleft()
        prev = SEP
        for j in range(n):  # its entries are the oldest of each deque: pop them on the left
            tok, pos = self._toks[j], self._base + j
            if tok != SEP:
                _pop_left(self._one, tok, pos)
                if prev != SEP:
                    _pop_left(self._two, _pair(prev, tok), pos)
            prev = tok
        del self._toks[:n]
        self._base += n

    # -- reading --------------------------------------------------------------------------

    def speculate(self, context: Sequence[int], k: int) -> Speculation:
        """The best-frequency continuation (up to k tokens) of the longest matched suffix."""
        if k < 1 or not context:
            return NOTHING
        occ, match = self._match(context)
        if not occ:
            return NOTHING
        p = self.params
        limit = min(k, math.ceil(p.factor * match))
        toks, base = self._toks, self._base
        ends = len(toks)
        at = [i + 1 - base for i in occ]  # list indices of each occurrence's next token
        out: list[int] = []
        prob, score = 1.0, 0.0
        while len(out) < limit and at:
            counts: dict[int, int] = {}
            latest: dict[int, int] = {}
            for j in at:  # oldest first, so `latest` ends with each token's latest
                if j < ends and toks[j] != SEP:
                    counts[toks[j]] = counts.get(toks[j], 0) + 1
                    latest[toks[j]] = j
            if not counts:
                break
            tok = max(counts, key=lambda t: (counts[t], latest[t]))
            prob *= counts[tok] / len(at)  # occurrences that end here count in the node
            if prob < p.min_prob:
                break
            out.append(tok)
            score += prob
            at = [j + 1 for j in at if j < ends and toks[j] == tok]
        return Speculation(tuple(out), score, match) if out else NOTHING

    def _match(self, context: Sequence[int]) -> tuple[list[int], int]:
        """(global positions where the longest matched suffix ends, oldest first; its
        length). Only occurrences with a token after them count."""
        if len(context) >= 2 and context[-2] >= 0 and context[-1] >= 0:
            occ, best = self._longest(self._two.get(_pair(context[-2], context[-1])), context)
            if occ:
                return occ, best
        return self._longest(self._one.get(context[-1]), context)

    def _longest(self, cands: deque[int] | None, context: Sequence[int]) -> tuple[list[int], int]:
        if not cands:
            return [], 0
        toks, base, p = self._toks, self._base, self.params
        top = min(p.max_match, len(context))
        best, occ = 0, []
        for n, i in enumerate(reversed(cands)):  # latest first
            if n >= p.max_candidates:
                break
            j = i - base
            if j + 1 >= len(toks) or toks[j + 1] == SEP:
                continue  # nothing follows it (the context's own end, or a sequence's)
            length = 1
            while length < top and j - length >= 0 and toks[j - length] == context[-1 - length]:
                length += 1
            if length > best:
                best, occ = length, [i]
            elif length == best:
                occ.append(i)
        occ.reverse()
        return occ, best


def _pop_left(index: dict[int, deque[int]], key: int, pos: int) -> None:
    entries = index[key]
    if entries and entries[0] == pos:
        entries.popleft()
    if not entries:
        del index[key]


class SuffixProposer:
    """Suffix decoding over the request's own text and, when given, a shared index (the
    serving layer passes the tenant's). One-hot q; no state beyond the context's index."""

    name = "suffix"

    def shared_draft(self) -> None:
        """Model-free: the batch calls `propose` (base.py)."""
        return None

    def __init__(self, shared: SuffixIndex | None = None, params: SuffixParams | None = None):
        self._shared = shared
        self._local = SuffixIndex(None, params)
        self._seen = 0  # context tokens in the local index
        self._last = SEP  # the last of them
        self.last: Speculation = NOTHING  # the latest proposal (what tests and stats read)
        self.from_shared = 0  # proposals taken from the shared index

    def propose(self, context_ids: Sequence[int], k: int) -> Proposal:
        self._index_context(context_ids)
        best = self._local.speculate(context_ids, k)
        shared = NOTHING if self._shared is None else self._shared.speculate(context_ids, k)
        if shared.score > best.score:
            best = shared
            self.from_shared += 1
        self.last = best
        return Proposal(list(best.tokens))

    def on_verified(self, n_accepted: int) -> None:
        """Nothing to learn: rejected tokens never enter the context, which is re-read."""

    def _index_context(self, ctx: Sequence[int]) -> None:
        """Add the context's new tokens; committed tokens only grow, so a context that does
        not extend what was indexed (never in the loop) starts the local index over."""
        n = self._seen
        if len(ctx) < n or (n and ctx[n - 1] != self._last):
            self._local = SuffixIndex(None, self._local.params)
            n = 0
        if len(ctx) > n:
            self._local.extend(ctx[n:])
            self._seen, self._last = len(ctx), ctx[-1]
