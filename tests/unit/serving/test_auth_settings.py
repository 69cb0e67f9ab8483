"""The OIDC key set's reading schedule (a clock we move), the admin key's start check and the
masking of connection URLs: the rules behind issue 44's smaller holes, case by case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from gateway.__main__ import masked_url
from gateway.serving.auth import ADMIN_KEY_MIN_LENGTH, check_admin_key
from gateway.serving.oidc import KeySet, OidcConfig, OidcVerifier, check_jwks_location


def jwk(kid: str) -> dict[str, Any]:
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    return {**json.loads(ECAlgorithm.to_jwk(key)), "kid": kid}


class Provider:
    """A JWKS source: the keys it serves now, how often it was read, whether it is down."""

    def __init__(self, *kids: str) -> None:
        self.keys = [jwk(k) for k in kids]
        self.reads = 0
        self.down = False

    def read(self, location: str) -> dict[str, Any]:
        self.reads += 1
        if self.down:
            raise OSError("connection refused")
        return {"keys": self.keys}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def keyset(provider: Provider, clock: Clock) -> KeySet:
    return KeySet("https://idp/jwks", refetch_s=30, max_age_s=300, read=provider.read, clock=clock)


def test_the_set_is_read_again_when_old_and_replaced() -> None:
    provider, clock = Provider("a"), Clock()
    keys = keyset(provider, clock)
    assert keys.key("a") is not None and provider.reads == 1
    clock.now += 299
    keys.key("a")
    assert provider.reads == 1  # still fresh
    provider.keys = [jwk("b")]  # the provider rotated
    clock.now += 1
    assert keys.key("b") is not None and provider.reads == 2
    with pytest.raises(jwt.InvalidTokenError, match="unknown signing key 'a'"):
        keys.key("a")


def test_unknown_kids_read_at_most_once_per_window() -> None:
    provider, clock = Provider("a"), Clock()
    keys = keyset(provider, clock)
    keys.key("a")
    for i in range(50):
        clock.now += 0.5
        with pytest.raises(jwt.InvalidTokenError):
            keys.key(f"x{i}")
    assert provider.reads == 2  # the first unknown kid read once; 24.5 s later still blocked
    clock.now += 5.5  # 30 s after the first
    with pytest.raises(jwt.InvalidTokenError):
        keys.key("y")
    assert provider.reads == 3


def test_a_failed_read_keeps_the_keys_and_is_retried_after_the_window() -> None:
    provider, clock = Provider("a"), Clock()
    keys = keyset(provider, clock)
    keys.key("a")
    provider.down = True
    clock.now += 300
    assert keys.key("a") is not None and provider.reads == 2  # old set kept
    clock.now += 10
    keys.key("a")
    assert provider.reads == 2  # no retry within 30 s
    provider.down = False
    clock.now += 20
    keys.key("a")
    assert provider.reads == 3


@pytest.mark.parametrize(
    ("location", "ok"),
    [
        ("/etc/gateway/jwks.json", True),
        ("https://idp.example/.well-known/jwks.json", True),
        ("http://127.0.0.1:8080/jwks", True),
        ("http://127.3.4.5/jwks", True),
        ("http://localhost/jwks", True),
        ("http://[::1]/jwks", True),
        ("http://idp.example/jwks", False),
        ("http://192.168.1.10/jwks", False),
        ("http://127.0.0.1.evil.example/jwks", False),
        ("file:///etc/jwks.json", False),
        ("https:///jwks", False),
    ],
)
def test_jwks_locations(location: str, ok: bool) -> None:
    if ok:
        check_jwks_location(location)
    else:
        with pytest.raises(ValueError, match="GATEWAY_OIDC_JWKS"):
            check_jwks_location(location)


@pytest.mark.parametrize(
    "key", ["CHANGE_ME", "change_me", " CHANGE_ME ", "sk-admin-CHANGE_ME-please", "sk-admin-..."]
)
def test_placeholders_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="sample placeholder"):
        check_admin_key(key)


def test_short_keys_are_refused_and_unset_is_fine() -> None:
    with pytest.raises(ValueError, match=f"at least {ADMIN_KEY_MIN_LENGTH}"):
        check_admin_key("x" * (ADMIN_KEY_MIN_LENGTH - 1))
    check_admin_key("x" * ADMIN_KEY_MIN_LENGTH)
    check_admin_key(None)
    check_admin_key("")  # unset: one is generated


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+asyncpg://gw:p%40ss@db:5432/gw", "postgresql+asyncpg://gw:***@db:5432/gw"),
        ("postgresql+asyncpg://gw@db/gw", "postgresql+asyncpg://gw@db/gw"),
        ("redis://:pw@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://user:pw@redis:6380/1", "rediss://user:***@redis:6380/1"),
        ("sqlite+aiosqlite:////var/gw.db", "sqlite+aiosqlite:////var/gw.db"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert masked_url(url) == shown


def test_an_unreadable_jwks_file_stops_the_start(tmp_path: Path) -> None:
    config = OidcConfig(str(tmp_path / "missing.json"), issuer="https://idp", audience="gw")
    with pytest.raises(ValueError, match="GATEWAY_OIDC_JWKS: cannot read"):
        OidcVerifier(config)
