"""Fresh PostgreSQL databases for integration tests.

    async with fresh_database() as url:      # postgresql+asyncpg://.../t_<random>
        ...

    pg_url = pg_database_fixture()           # in a test module or conftest.py
    async def test_x(pg_url: str): ...

The admin connection comes from env ``TEST_POSTGRES_URL`` (default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``). Each database gets a unique name and is
dropped (``WITH (FORCE)``) afterwards. When the server is unreachable the test is skipped,
unless env ``CI`` is ``true``: then it fails loudly, because CI must run these tests.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

DEFAULT_ADMIN_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


def admin_url() -> str:
    return os.environ.get("TEST_POSTGRES_URL", DEFAULT_ADMIN_URL)


def _unreachable(exc: BaseException) -> None:
    message = f"PostgreSQL unreachable at {make_url(admin_url())!r}: {exc}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI=true: PostgreSQL tests must run)", pytrace=False)
    pytest.skip(message)


def admin_engine() -> AsyncEngine:
    return create_async_engine(
        admin_url(), isolation_level="AUTOCOMMIT", connect_args={"timeout": 5}
    )


@asynccontextmanager
async def fresh_database(prefix: str = "t") -> AsyncIterator[str]:
    """Create a uniquely named database, yield its async URL, drop it afterwards."""
    name = f"{prefix}_{secrets.token_hex(6)}".lower()
    engine = admin_engine()
    try:
        try:
            async with engine.connect() as conn:
                await conn.execute(text(f'CREATE DATABASE "{name}"'))
        except (OSError, OperationalError, DBAPIError, TimeoutError) as exc:
            _unreachable(exc)
        url = make_url(admin_url()).set(database=name)
        try:
            yield url.render_as_string(hide_password=False)
        finally:
            async with engine.connect() as conn:
                await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await engine.dispose()


def pg_database_fixture(prefix: str = "t", scope: Any = "function") -> Callable[..., Any]:
    """A pytest-asyncio fixture yielding a fresh database URL; assign it to a module-level
    name (that name is the fixture's name)."""
    import pytest_asyncio

    @pytest_asyncio.fixture(scope=scope, loop_scope=scope)
    async def _fixture() -> AsyncIterator[str]:
        async with fresh_database(prefix) as url:
            yield url

    return _fixture
