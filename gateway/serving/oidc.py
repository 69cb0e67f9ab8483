"""Operators signed in at an identity provider: OIDC / JWT bearer tokens (PyJWT).

A token is accepted when its signature verifies against the provider's JWKS (a file, read
at start, or a URL, fetched and cached by PyJWKClient, re-fetched for an unknown key id),
it has not expired, and its issuer and audience match the configured ones (when set). Its
role comes from a claim (``roles`` by default; a dotted path such as
``realm_access.roles`` reaches into nested claims), which may hold one role or a list: the
first of ``ROLE_ORDER`` found wins. The actor is ``oidc:`` + the name claim (``sub`` by
default), so a token's events cannot pass for a named operator's.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import jwt

from gateway.serving.commands import Principal, Role
from gateway.serving.errors import GatewayError

ROLE_ORDER: tuple[Role, ...] = ("admin", "policy-author", "rollout-operator", "auditor")
ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256"]


@dataclass(frozen=True)
class OidcConfig:
    jwks: str
    """Path of a JWKS file, or an https:// URL serving one."""
    issuer: str | None = None
    audience: str | None = None
    role_claim: str = "roles"
    name_claim: str = "sub"


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
        self.config = config
        self._client: jwt.PyJWKClient | None = None
        self._keys: dict[str, jwt.PyJWK] = {}
        if config.jwks.startswith(("https://", "http://")):
            self._client = jwt.PyJWKClient(config.jwks, cache_keys=True, lifespan=300)
        else:
            keyset = jwt.PyJWKSet.from_dict(json.loads(Path(config.jwks).read_text()))
            self._keys = {k.key_id or "": k for k in keyset.keys}

    def _key(self, token: str) -> jwt.PyJWK:
        if self._client is not None:
            return self._client.get_signing_key_from_jwt(token)
        kid = jwt.get_unverified_header(token).get("kid") or ""
        if kid not in self._keys:
            if len(self._keys) == 1 and not kid:
                return next(iter(self._keys.values()))
            raise jwt.InvalidTokenError(f"unknown signing key {kid!r}")
        return self._keys[kid]

    def verify(self, token: str) -> Principal:
        """The operator a token names (blocking: a JWKS URL may be fetched)."""
        cfg = self.config
        try:
            key = self._key(token)
            claims = jwt.decode(
                token,
                key=key,
                algorithms=ALGORITHMS,
                audience=cfg.audience,
                issuer=cfg.issuer,
                options={"require": ["exp"], "verify_aud": cfg.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise _unauthorized("The token has expired.", "expired_token") from None
        except (jwt.InvalidTokenError, jwt.PyJWKClientError) as exc:
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
        if self._client is None:
            return self.verify(token)
        return await asyncio.to_thread(self.verify, token)
