"""PostgreSQL session limits: from the settings to asyncpg's server_settings."""

from __future__ import annotations

import pytest

from gateway.database.base import DEFAULT_TIMEOUTS, Timeouts
from gateway.serving import database_timeouts
from gateway.settings import Settings


def test_defaults_and_settings() -> None:
    assert DEFAULT_TIMEOUTS.server_settings() == {
        "lock_timeout": "5000",
        "statement_timeout": "15000",
        "idle_in_transaction_session_timeout": "60000",
    }
    env = {
        "GATEWAY_DATABASE_LOCK_TIMEOUT_MS": "250",
        "GATEWAY_DATABASE_STATEMENT_TIMEOUT_MS": "0",
        "GATEWAY_RETENTION_INTERVAL_S": "0",
    }
    settings = Settings.from_env(env)
    assert settings.retention_interval_s == 0
    assert database_timeouts(settings) == Timeouts(250, 0, 60_000)
    assert database_timeouts(Settings()) == DEFAULT_TIMEOUTS


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        Timeouts(lock_ms=-1)
