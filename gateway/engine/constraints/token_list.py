"""A Grammar over explicit token sequences (a trie). Small, exact, and useful in tests."""

from __future__ import annotations

from collections.abc import Iterable

import torch


class TokenSequencesGrammar:
    """Accepts exactly the given token sequences (and their prefixes while decoding).

    `repeat=True` accepts any concatenation of them (complete after each whole sequence).
    """

    def __init__(self, sequences: Iterable[Iterable[int]], repeat: bool = False) -> None:
        self._trie: dict[int, dict] = {}
        self._ends: set[int] = set()  # ids of trie nodes that end a sequence
        for seq in sequences:
            node = self._trie
            for tok in seq:
                node = node.setdefault(tok, {})
            self._ends.add(id(node))
        self._repeat = repeat
        self._path: list[dict[int, dict]] = [self._trie]
        self._consumed: list[int] = []

    @property
    def consumed(self) -> tuple[int, ...]:
        return tuple(self._consumed)

    def _next_nodes(self) -> dict[int, dict]:
        node = self._path[-1]
        if self._repeat and id(node) in self._ends:
            return {**node, **self._trie}
        return node

    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        mask = torch.zeros(vocab_size, dtype=torch.bool)  # (V,)
        nxt = [t for t in self._next_nodes() if t < vocab_size]
        if nxt:
            mask[torch.tensor(nxt)] = True
        return mask

    def consume(self, token_id: int) -> None:
        node = self._path[-1]
        if token_id in node:
            child = node[token_id]
        elif self._repeat and id(node) in self._ends and token_id in self._trie:
            child = self._trie[token_id]
        else:
            raise ValueError(f"token {token_id} is not allowed here")
        self._path.append(child)
        self._consumed.append(token_id)

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._consumed):
            raise ValueError(f"cannot roll back {n} of {len(self._consumed)} tokens")
        if n:
            del self._path[-n:]
            del self._consumed[-n:]

    def is_complete(self) -> bool:
        return id(self._path[-1]) in self._ends
