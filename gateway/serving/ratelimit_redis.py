"""Per-tenant limits shared by every replica: the sliding 60-second window kept in Redis.

One tenant's window is three keys under one hash tag (so a Redis Cluster keeps them on one
slot): a sorted set of tickets scored by admission time in ms, a hash ticket -> tokens
charged, and the running token total. Admission is one Lua script (atomic on the server):
drop the tickets older than the window (subtracting their tokens), then admit when both
the request count and the token total leave room. Time is the Redis server's (``TIME``),
so replicas with skewed clocks share one window. Settling rewrites a ticket's tokens and
the total by the difference, in a second script.

Redis down (refused, timed out): by default each replica falls back to its own in-process
window (``RateLimiter``: the limit holds per replica, so N replicas let up to N x through)
and counts the failure (``stats``, exported as ``gateway_ratelimit_backend_errors_total``)
with a warning at most every ``LOG_EVERY_S``. With ``fail_closed`` the request is refused
instead (503 ``rate_limiter_unavailable``). After a failure Redis is not asked again for
``RETRY_S``, so an outage costs no connect timeout per request.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from dataclasses import dataclass

import redis.asyncio as redis
from redis.exceptions import RedisError

from gateway.serving.errors import GatewayError
from gateway.serving.ratelimit import WINDOW_S, Limits, Quota, RateLimiter, Ticket

log = logging.getLogger("gateway.ratelimit")
LOG_EVERY_S = 30.0
RETRY_S = 1.0
TIMEOUT_S = 0.25

ADMIT = """
local z, h, t = KEYS[1], KEYS[2], KEYS[3]
local req_limit, tok_limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens, id, window = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
while true do
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now - window, 'LIMIT', 0, 500)
  if #gone == 0 then break end
  local charged = redis.call('HMGET', h, unpack(gone))
  local sum = 0
  for _, v in ipairs(charged) do if v then sum = sum + tonumber(v) end end
  redis.call('HDEL', h, unpack(gone))
  redis.call('ZREM', z, unpack(gone))
  if sum ~= 0 then redis.call('DECRBY', t, sum) end
end
local count = redis.call('ZCARD', z)
local used = tonumber(redis.call('GET', t) or '0')
local oldest = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
local age = 0
if oldest[2] then age = now - tonumber(oldest[2]) end
local ok = 0
if count < req_limit and used + tokens <= tok_limit then
  redis.call('ZADD', z, now, id)
  redis.call('HSET', h, id, tokens)
  redis.call('INCRBY', t, tokens)
  count = count + 1
  used = used + tokens
  ok = 1
end
for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, window + 1000) end
return {ok, count, used, age}
"""

SETTLE = """
local old = redis.call('HGET', KEYS[2], ARGV[1])
if old then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('INCRBY', KEYS[3], tonumber(ARGV[2]) - tonumber(old))
end
return 0
"""


@dataclass(frozen=True)
class RedisTicket:
    keys: tuple[str, str, str]
    id: str


class RedisRateLimiter:
    def __init__(
        self,
        url: str,
        *,
        prefix: str = "gw:rl:",
        fail_closed: bool = False,
        window_s: float = WINDOW_S,
    ) -> None:
        self.client = redis.Redis.from_url(
            url, socket_connect_timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S
        )
        self.prefix = prefix
        self.fail_closed = fail_closed
        self.window_s = window_s
        self.local = RateLimiter()
        self.stats = self.local.stats
        self._admit = self.client.register_script(ADMIT)
        self._settle = self.client.register_script(SETTLE)
        self._ids = itertools.count()
        self._tag = f"{os.getpid()}-{os.urandom(4).hex()}"
        self._down_until = 0.0
        self._logged = 0.0

    def _keys(self, tenant: str) -> tuple[str, str, str]:
        base = f"{self.prefix}{{{tenant}}}"
        return (f"{base}:z", f"{base}:h", f"{base}:t")

    async def admit(self, tenant: str, limits: Limits, tokens: int) -> tuple[Quota, Ticket]:
        if time.monotonic() >= self._down_until:
            keys = self._keys(tenant)
            ticket = RedisTicket(keys, f"{self._tag}-{next(self._ids)}")
            window_ms = int(self.window_s * 1000)
            args: list[str | int] = [
                limits.requests_per_minute, limits.tokens_per_minute, tokens, ticket.id, window_ms
            ]  # fmt: skip
            try:
                ok, count, used, age_ms = await self._admit(keys=list(keys), args=args)
            except (RedisError, OSError) as exc:
                self._failed(exc)
            else:
                quota = _quota(
                    limits, bool(ok), int(count), int(used), age_ms / 1000, self.window_s
                )
                return quota, (ticket if ok else None)
        if self.fail_closed:
            self.stats.refused_unavailable += 1
            raise GatewayError(
                "unavailable",
                "the shared rate limiter (Redis) is unavailable; retry shortly",
                code="rate_limiter_unavailable",
                retry_after=math.ceil(RETRY_S) + 1,
            )
        self.stats.local_fallbacks += 1
        return await self.local.admit(tenant, limits, tokens)

    async def settle(self, ticket: Ticket, tokens_used: int) -> None:
        if not isinstance(ticket, RedisTicket):
            await self.local.settle(ticket, tokens_used)
            return
        try:
            await self._settle(keys=list(ticket.keys), args=[ticket.id, int(tokens_used)])
        except (RedisError, OSError) as exc:  # the reservation stays charged: errs strict
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        self.stats.backend_errors += 1
        now = time.monotonic()
        self._down_until = now + RETRY_S
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            then = "refusing requests (503)" if self.fail_closed else "using per-replica limits"
            log.warning("rate limiter: Redis unavailable (%s); %s", exc, then)

    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        await self.client.aclose()


def _quota(limits: Limits, ok: bool, count: int, used: int, age_s: float, window_s: float) -> Quota:
    """The quota the headers report; ``count`` and ``used`` include this request when
    admitted; ``age_s``: age of the window's oldest ticket."""
    reset = max(0.0, window_s - age_s) if count else 0.0
    retry = 0 if ok else (math.ceil(reset) or 1)
    return Quota(
        limit_requests=limits.requests_per_minute,
        remaining_requests=max(0, limits.requests_per_minute - count),
        reset_requests_s=reset,
        limit_tokens=limits.tokens_per_minute,
        remaining_tokens=max(0, limits.tokens_per_minute - used),
        reset_tokens_s=reset,
        allowed=ok,
        retry_after_s=retry,
    )
