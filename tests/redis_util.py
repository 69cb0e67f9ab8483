"""The machine's Redis for integration tests.

    prefix = await redis_prefix()     # a unique key prefix; the test's keys are deleted after

The server comes from env ``TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). When it
is unreachable the test is skipped, unless env ``CI`` is ``true``: then it fails, because CI
must run these tests (``.ci/run`` starts Redis when it is not running).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as redis
from redis.exceptions import RedisError

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redis_url() -> str:
    return os.environ.get("TEST_REDIS_URL", DEFAULT_URL)


def _unreachable(exc: BaseException) -> None:
    message = f"Redis unreachable at {redis_url()}: {exc}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: Redis tests must run)", pytrace=False)
    pytest.skip(message)


async def _prefix() -> AsyncIterator[str]:
    client = redis.Redis.from_url(redis_url(), socket_connect_timeout=2)
    try:
        try:
            await client.ping()
        except (RedisError, OSError) as exc:
            _unreachable(exc)
        prefix = f"test:{secrets.token_hex(6)}:"
        yield prefix
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def redis_prefix_fixture(scope: Any = "function") -> Callable[..., Any]:
    """A pytest-asyncio fixture yielding a unique key prefix on a reachable Redis; assign it
    to a module-level name (that name is the fixture's name)."""
    import pytest_asyncio

    @pytest_asyncio.fixture(scope=scope, loop_scope=scope)
    async def _fixture() -> AsyncIterator[str]:
        async for prefix in _prefix():
            yield prefix

    return _fixture
