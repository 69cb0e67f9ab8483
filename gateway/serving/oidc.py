"""Operators signed in at an identity provider: OIDC / JWT bearer tokens (PyJWT).

A token is accepted when its signature verifies against a key of the provider's JWKS, it
has not expired, and its issuer and audience are the configured ones. Issuer and audience
are required settings: a verifier without them refuses to start unless
``allow_unchecked_claims`` (GATEWAY_OIDC_ALLOW_UNCHECKED_CLAIMS) says so, since a token
minted by the same provider for any other application would otherwise pass.

The JWKS is a file or an ``https://`` URL (``http://`` only to a loopback host: a local
test server or a sidecar). The key set (:class:`KeySet`) is read at the first token (a
file: at start), again every ``max_age_s`` (300 s), and again on a token whose ``kid`` it
does not hold, such reads at most once every ``refetch_s`` (30 s), so a flood of made-up
key ids costs the provider one fetch per 30 s. Each read replaces the whole set: a key the
provider removed is refused from the next read on. A failed read keeps the set it had
(logged) and is tried again after ``refetch_s``.

Its role comes from a claim (``roles`` by default; a dotted path such as
``realm_access.roles`` reaches into nested claims), which may hold one role or a list: the
first of ``ROLE_ORDER`` found wins. The actor is ``oidc:`` + the name claim (``sub`` by
default), so a token's events cannot pass for a named operator's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import jwt

from gateway.serving.commands import Principal, Role
from gateway.serving.errors import GatewayError

log = logging.getLogger("gateway.auth")
ROLE_ORDER: tuple[Role, ...] = ("admin", "policy-author", "rollout-operator", "auditor")
ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256"]
MAX_JWKS_BYTES = 1 << 20
"""A JWKS larger than this is refused (a provider's holds a few keys, a few KiB)."""
FETCH_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class OidcConfig:
    jwks: str
    """Path of a JWKS file, or an https:// URL serving one (http:// to a loopback host)."""
    issuer: str | None = None
    audience: str | None = None
    role_claim: str = "roles"
    name_claim: str = "sub"
    allow_unchecked_claims: bool = False
    """Accept a missing ``issuer`` / ``audience`` setting: that claim is then not checked."""
    refetch_s: float = 30.0
    """Least time between two reads of the key set caused by unknown key ids (and between
    a failed read and the next)."""
    max_age_s: float = 300.0
    """A key set older than this is read again before it verifies a token."""

    def check(self) -> None:
        """Raise ValueError, naming the setting, when this configuration is unsafe."""
        missing = [n for n, v in (("issuer", self.issuer), ("audience", self.audience)) if not v]
        if missing and not self.allow_unchecked_claims:
            names = " and ".join(f"GATEWAY_OIDC_{n.upper()}" for n in missing)
            raise ValueError(
                f"GATEWAY_OIDC_JWKS is set but {names} is not: tokens the provider issued to "
                "any other application would be accepted. Set it, or set "
                "GATEWAY_OIDC_ALLOW_UNCHECKED_CLAIMS=true to accept that."
            )
        check_jwks_location(self.jwks)


def _loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_jwks_location(jwks: str) -> None:
    """A file path, an https:// URL, or an http:// URL to a loopback host; else ValueError."""
    if "://" not in jwks:
        return
    parts = urlsplit(jwks)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and _loopback(parts.hostname):
        return
    raise ValueError(
        f"GATEWAY_OIDC_JWKS must be a file path or an https:// URL (http:// only to a "
        f"loopback host such as 127.0.0.1), got {jwks!r}: keys fetched in the clear could "
        "be replaced on the way"
    )


def read_jwks(location: str) -> dict[str, Any]:
    """The JWKS document at a path or URL (blocking)."""
    if "://" not in location:
        return cast(dict[str, Any], json.loads(Path(location).read_text()))
    check_jwks_location(location)
    request = urllib.request.Request(location, headers={"accept": "application/json"})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
        check_jwks_location(response.geturl())  # a redirect to http:// is refused too
        body = response.read(MAX_JWKS_BYTES + 1)
    if len(body) > MAX_JWKS_BYTES:
        raise ValueError(f"the JWKS at {location} is larger than {MAX_JWKS_BYTES} bytes")
    return cast(dict[str, Any], json.loads(body))


class KeySet:
    """The provider's signing keys by key id, read again when old or asked for an unknown
    id (rate-limited); each read replaces the set. Thread-safe (tokens verify on threads)."""

    def __init__(
        self,
        location: str,
        *,
        refetch_s: float,
        max_age_s: float,
        read: Callable[[str], dict[str, Any]] = read_jwks,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.location, self.refetch_s, self.max_age_s = location, refetch_s, max_age_s
        self._read, self._clock = read, clock
        self._lock = threading.Lock()
        self._keys: dict[str, jwt.PyJWK] = {}
        self._read_at: float | None = None
        """When the set was last read (successfully)."""
        self._tried_at: float | None = None
        """When a read was last attempted (successful or not)."""
        self._forced_at: float | None = None
        """When a token with an unknown key id last caused a read."""
        self.reads = 0
        """Reads attempted (a plain counter, for tests and logs)."""

    def load(self) -> None:
        """Read the set now; ValueError when that fails (a start-time check of a file)."""
        with self._lock:
            self._refresh(strict=True)

    def _refresh(self, strict: bool = False) -> None:
        self.reads += 1
        self._tried_at = self._clock()
        try:
            keyset = jwt.PyJWKSet.from_dict(self._read(self.location))
        except Exception as exc:  # keep serving with the keys we had
            if strict:
                raise ValueError(
                    f"GATEWAY_OIDC_JWKS: cannot read a key set from {self.location}: {exc}"
                ) from exc
            log.warning("could not read the OIDC JWKS at %s: %s", self.location, exc)
            return
        self._keys = {k.key_id or "": k for k in keyset.keys}
        self._read_at = self._tried_at

    def key(self, kid: str) -> jwt.PyJWK:
        """The key with this id; raises jwt.InvalidTokenError when the provider has none."""
        with self._lock:
            now = self._clock()
            stale = self._read_at is None or now - self._read_at >= self.max_age_s
            if stale and (self._tried_at is None or now - self._tried_at >= self.refetch_s):
                self._refresh()  # the set replaced: added keys appear, removed ones go
            elif kid not in self._keys and (
                self._forced_at is None or now - self._forced_at >= self.refetch_s
            ):
                self._forced_at = now
                self._refresh()  # perhaps a key the provider added since our last read
            if kid not in self._keys:
                if not kid and len(self._keys) == 1:
                    return next(iter(self._keys.values()))
                raise jwt.InvalidTokenError(f"unknown signing key {kid!r}")
            return self._keys[kid]


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and token.startswith("eyJ")


def _claim(claims: dict[str, Any], path: str) -> Any:
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _unauthorized(message: str, code: str) -> GatewayError:
    return GatewayError("authentication", message, code=code)


class OidcVerifier:
    def __init__(self, config: OidcConfig) -> None:
        config.check()
        self.config = config
        self.keys = KeySet(config.jwks, refetch_s=config.refetch_s, max_age_s=config.max_age_s)
        if "://" not in config.jwks:  # a file is there at start, or the start fails
            self.keys.load()

    def verify(self, token: str) -> Principal:
        """The operator a token names (blocking: the JWKS may be read)."""
        cfg = self.config
        required = ["exp"] + [n for n, v in (("iss", cfg.issuer), ("aud", cfg.audience)) if v]
        try:
            kid = jwt.get_unverified_header(token).get("kid") or ""
            claims = jwt.decode(
                token,
                key=self.keys.key(str(kid)),
                algorithms=ALGORITHMS,
                audience=cfg.audience,
                issuer=cfg.issuer,
                options={"require": required, "verify_aud": cfg.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise _unauthorized("The token has expired.", "expired_token") from None
        except jwt.InvalidTokenError as exc:
            raise _unauthorized(f"The token was refused: {exc}", "invalid_token") from None
        name = _claim(claims, cfg.name_claim)
        if not isinstance(name, str) or not name:
            raise _unauthorized(f"The token has no '{cfg.name_claim}' claim.", "invalid_token")
        raw = _claim(claims, cfg.role_claim)
        held = {raw} if isinstance(raw, str) else set(raw) if isinstance(raw, list) else set()
        role = next((r for r in ROLE_ORDER if r in held), None)
        if role is None:
            raise GatewayError(
                "permission",
                f"the token's '{cfg.role_claim}' claim names no operator role "
                f"({', '.join(ROLE_ORDER)})",
                code="forbidden",
            )
        return Principal(role=cast(Role, role), tenant_id=None, key_id=None, name=f"oidc:{name}")

    async def principal(self, token: str) -> Principal:
        return await asyncio.to_thread(self.verify, token)
