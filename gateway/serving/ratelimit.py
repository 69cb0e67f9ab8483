"""Per-tenant requests/min and tokens/min limits over a sliding 60-second window.

Tokens are charged at admission as prompt tokens + the completion budget, then settled
to the tokens actually used when the request ends. `RateLimiter` keeps the window in this
process (the default: with several replicas each enforces the limit on its own share, so
N replicas let up to N x the limit through); `ratelimit_redis.RedisRateLimiter` keeps it
in Redis, shared by every replica.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

WINDOW_S = 60.0


Ticket = Any
"""What admit() charged, for settle() to correct (None: nothing charged); each limiter
knows its own tickets."""


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int
    tokens_per_minute: int


@dataclass(frozen=True)
class Quota:
    """What the x-ratelimit-* headers report after a request was admitted or refused."""

    limit_requests: int
    remaining_requests: int
    reset_requests_s: float
    limit_tokens: int
    remaining_tokens: int
    reset_tokens_s: float
    allowed: bool
    retry_after_s: int = 0


@dataclass
class LimiterStats:
    """Counters of the shared limiter's backend (plain data; http/metrics exports them)."""

    backend_errors: int = 0
    """Calls to Redis that failed (connection refused, timeout, script error)."""
    local_fallbacks: int = 0
    """Requests limited by this replica's own window (admitted or refused) while Redis was
    down."""
    refused_unavailable: int = 0
    """Requests refused with 503 because Redis was down (fail-closed mode)."""


class Limiter(Protocol):
    stats: LimiterStats

    async def admit(self, tenant: str, limits: Limits, tokens: int) -> tuple[Quota, Ticket]: ...

    async def settle(self, ticket: Ticket, tokens_used: int) -> None: ...

    async def close(self) -> None: ...


class _Window:
    def __init__(self) -> None:
        self.requests: deque[float] = deque()
        self.tokens: deque[list[float]] = deque()  # [time, tokens], tokens settled in place

    def trim(self, now: float) -> None:
        while self.requests and now - self.requests[0] >= WINDOW_S:
            self.requests.popleft()
        while self.tokens and now - self.tokens[0][0] >= WINDOW_S:
            self.tokens.popleft()


class RateLimiter:
    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()
        self._now = time.monotonic
        self.stats = LimiterStats()

    async def admit(self, tenant: str, limits: Limits, tokens: int) -> tuple[Quota, Ticket]:
        """Charge one request and ``tokens``; returns the quota and a ticket for settle()."""
        now = self._now()
        with self._lock:
            w = self._windows.setdefault(tenant, _Window())
            w.trim(now)
            used_tokens = sum(t for _, t in w.tokens)
            ok_req = len(w.requests) < limits.requests_per_minute
            ok_tok = used_tokens + tokens <= limits.tokens_per_minute
            reset_r = WINDOW_S - (now - w.requests[0]) if w.requests else 0.0
            reset_t = WINDOW_S - (now - w.tokens[0][0]) if w.tokens else 0.0
            ticket = None
            if ok_req and ok_tok:
                w.requests.append(now)
                ticket = [now, float(tokens)]
                w.tokens.append(ticket)
            retry = 0
            if ticket is None:
                retry = math.ceil(reset_r if not ok_req else reset_t) or 1
            quota = Quota(
                limit_requests=limits.requests_per_minute,
                remaining_requests=max(0, limits.requests_per_minute - len(w.requests)),
                reset_requests_s=reset_r,
                limit_tokens=limits.tokens_per_minute,
                remaining_tokens=max(
                    0, limits.tokens_per_minute - int(used_tokens) - (tokens if ticket else 0)
                ),
                reset_tokens_s=reset_t,
                allowed=ticket is not None,
                retry_after_s=retry,
            )
            return quota, ticket

    async def settle(self, ticket: Ticket, tokens_used: int) -> None:
        if isinstance(ticket, list):
            with self._lock:
                ticket[1] = float(tokens_used)

    async def close(self) -> None:
        return None
