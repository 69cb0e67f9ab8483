"""Alembic environment: gateway.database.tables metadata only, async engines.

URL precedence: a connection handed in by ``gateway.database.migrate`` (config.attributes),
``alembic -x url=...``, env ``GATEWAY_DATABASE_URL``, ``sqlalchemy.url`` set programmatically,
else ``sqlite+aiosqlite:///var/gateway.db``.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from gateway.database.base import make_engine
from gateway.database.tables import Base

config = context.config
target_metadata = Base.metadata
DEFAULT_URL = "sqlite+aiosqlite:///var/gateway.db"


def database_url() -> str:
    x_args = context.get_x_argument(as_dictionary=True)
    return (
        x_args.get("url")
        or os.environ.get("GATEWAY_DATABASE_URL")
        or config.get_main_option("sqlalchemy.url")
        or DEFAULT_URL
    )


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_configure)
            await conn.commit()
    finally:
        await engine.dispose()


def run_offline() -> None:
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
    else:
        asyncio.run(_run_async(database_url()))


if context.is_offline_mode():
    run_offline()
else:
    run_online()
