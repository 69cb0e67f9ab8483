"""Each tenant's suffix index (proposer "suffix", engine/proposers/suffix.py), per target.

A tenant's finished requests (prompt and output tokens) feed its own index, never another
tenant's: suffix decoding would otherwise draft one tenant's text into another's requests,
and the drafts' acceptance would leak it through timing. Indexes are per target model too:
token ids mean nothing across tokenizers.

Threads: the event loop records a finished request (`record`: a deque append under a lock
held for O(1) work, so it never waits on decoding); the inference thread, which alone reads
and changes the index, takes the pending sequences in when a request of the tenant starts
decoding (`TenantSuffix.index`, called by the engine as it wires the proposer). Pending
sequences are bounded by the same token budget as the index, oldest dropped first.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from gateway.engine import SuffixIndex

DEFAULT_BUDGET_TOKENS = 65_536
"""Tokens a tenant's index keeps per target (prompts and outputs, oldest evicted first);
the index holds about two positions per token besides the tokens themselves."""


class TenantSuffix:
    """One tenant's index on one target, with its hand-over queue (a `SuffixSource`)."""

    def __init__(self, budget_tokens: int) -> None:
        self._index = SuffixIndex(budget_tokens)
        self._budget = budget_tokens
        self._pending: deque[tuple[int, ...]] = deque()
        self._pending_tokens = 0
        self._lock = threading.Lock()  # guards _pending and _pending_tokens only

    def record(self, tokens: Sequence[int]) -> None:
        """Queue a finished sequence (any thread)."""
        seq = tuple(tokens[-self._budget :])
        if not seq:
            return
        with self._lock:
            self._pending.append(seq)
            self._pending_tokens += len(seq)
            while self._pending_tokens > self._budget:
                self._pending_tokens -= len(self._pending.popleft())

    def index(self) -> SuffixIndex:
        """The index with every queued sequence added (the decoding thread only)."""
        with self._lock:
            taken = list(self._pending)
            self._pending.clear()
            self._pending_tokens = 0
        for seq in taken:  # outside the lock: a record() never waits for this
            self._index.add(seq)
        return self._index

    @property
    def pending_tokens(self) -> int:
        return self._pending_tokens


class SuffixStore:
    """Tenant x target -> TenantSuffix, created on first use."""

    def __init__(self, budget_tokens: int = DEFAULT_BUDGET_TOKENS) -> None:
        if budget_tokens < 1:
            raise ValueError(f"the suffix budget must be at least 1 token, got {budget_tokens}")
        self.budget_tokens = budget_tokens
        self._by_key: dict[tuple[str, str], TenantSuffix] = {}
        self._lock = threading.Lock()

    def source(self, tenant: str, model: str) -> TenantSuffix:
        """The tenant's index on `model` (what a DecodeRequest's suffix_source gets)."""
        key = (tenant, model)
        with self._lock:
            found = self._by_key.get(key)
            if found is None:
                found = self._by_key[key] = TenantSuffix(self.budget_tokens)
            return found

    def record(self, tenant: str, model: str, prompt: Sequence[int], output: Sequence[int]) -> None:
        """A finished request of `tenant` on `model`: its prompt and output, one sequence."""
        self.source(tenant, model).record((*prompt, *output))
