"""Per-tenant requests/min and tokens/min limits: a sliding 60-second window in memory.

Tokens are charged at admission as prompt tokens + the completion budget, then settled
to the tokens actually used when the request ends.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

WINDOW_S = 60.0


Ticket = list[float] | None
"""What admit() charged, for settle() to correct (None: nothing charged)."""


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

    def admit(self, tenant: str, limits: Limits, tokens: int) -> tuple[Quota, Ticket]:
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

    def settle(self, ticket: Ticket, tokens_used: int) -> None:
        if ticket is not None:
            with self._lock:
                ticket[1] = float(tokens_used)
