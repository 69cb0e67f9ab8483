"""Bearer keys -> principals: the bootstrap admin key, named operators' keys (with a role:
admin, policy-author, rollout-operator, auditor), operators' OIDC tokens (oidc.py), tenant
keys and tenant auditor keys.
Expired keys are refused (401); each use is recorded at most once a minute.

Keys are stored hashed (SHA-256); the admin key comes from GATEWAY_ADMIN_KEY or is
generated on first start, printed once, and only its hash is kept on disk. A
GATEWAY_ADMIN_KEY shorter than ADMIN_KEY_MIN_LENGTH or equal to a placeholder of the
samples (``CHANGE_ME`` in deploy/, ``sk-admin-...`` in the README) stops the start.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, cast, get_args

from gateway.database import Database
from gateway.database import sha256_text as _sha
from gateway.serving.commands import Principal, Role
from gateway.serving.errors import GatewayError
from gateway.serving.oidc import OidcVerifier, looks_like_jwt

log = logging.getLogger("gateway.auth")


ADMIN_KEY_MIN_LENGTH = 16
"""Characters a GATEWAY_ADMIN_KEY needs at least (a generated one has 41)."""
SAMPLE_ADMIN_KEYS = frozenset(
    {"change_me", "changeme", "change-me", "sk-admin-...", "sk-admin-", "replace_me",
     "replace-me", "<admin-key>", "secret", "password", "admin"}
)  # fmt: skip
"""Placeholders of the samples (deploy/base/secret.yaml, README, docker-compose.yml) and
other well-known ones, compared case-insensitively."""


def check_admin_key(admin_key: str | None) -> None:
    """Raise ValueError naming GATEWAY_ADMIN_KEY when it is set to a sample placeholder or
    is too short to resist guessing (unset is fine: a key is generated)."""
    if not admin_key:
        return
    key = admin_key.strip()
    marker = key.lower()
    if marker in SAMPLE_ADMIN_KEYS or "change_me" in marker or "changeme" in marker:
        raise ValueError(
            f"GATEWAY_ADMIN_KEY is the sample placeholder {key!r}: anyone who read the samples "
            "knows it. Set a secret of your own (e.g. sk-admin- followed by the output of "
            "`openssl rand -hex 24`), or unset it to have one generated."
        )
    if len(key) < ADMIN_KEY_MIN_LENGTH:
        raise ValueError(
            f"GATEWAY_ADMIN_KEY is {len(key)} characters long; at least "
            f"{ADMIN_KEY_MIN_LENGTH} are required (e.g. sk-admin- followed by the output of "
            "`openssl rand -hex 24`), or unset it to have one generated."
        )


def bootstrap_admin_hash(admin_key: str | None, var_dir: str) -> str:
    """The admin key's hash; generates and prints a key on first start when none is set.
    ValueError when the key set is a placeholder or too short (:func:`check_admin_key`)."""
    check_admin_key(admin_key)
    if admin_key:
        return _sha(admin_key)
    path = Path(var_dir) / "admin_key.sha256"
    if path.exists():
        return path.read_text().strip()
    key = "sk-admin-" + secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_sha(key) + "\n")
    path.chmod(0o600)
    print(
        f"\n  Generated admin key (shown once, only its hash is kept in {path}):\n"
        f"    {key}\n  Set GATEWAY_ADMIN_KEY to choose your own.\n",
        file=sys.stderr,
        flush=True,
    )
    return _sha(key)


Permission = Literal[
    "tenants.read", "tenants.write", "operators.read", "operators.write",
    "policies.read", "policies.write", "rollouts.read", "rollouts.write", "audit.read",
]  # fmt: skip
ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "admin": frozenset(get_args(Permission)),
    "policy-author": frozenset({"policies.read", "policies.write", "tenants.read"}),
    "rollout-operator": frozenset({"rollouts.read", "rollouts.write", "policies.read"}),
    "auditor": frozenset({"audit.read", "policies.read", "rollouts.read", "tenants.read"}),
}
"""What each operator role may do. Tenant keys (and tenant-scoped auditor keys, which read
their own tenant's records only) have none of these."""
BOOTSTRAP = "admin"
"""The principal the bootstrap key (GATEWAY_ADMIN_KEY) acts as."""


def allows(p: Principal, permission: Permission) -> bool:
    if p.tenant_id is not None or p.role == "tenant":
        return False
    return permission in ROLE_PERMISSIONS.get(p.role, frozenset())


def _unknown(key: str, why: str, code: str = "invalid_api_key") -> GatewayError:
    shown = key[:6] + "..." + key[-4:] if len(key) > 12 else "***"
    return GatewayError("authentication", f"Incorrect API key provided: {shown}. {why}", code=code)


class Authenticator:
    def __init__(self, store: Database, admin_hash: str, oidc: OidcVerifier | None = None) -> None:
        self.store = store
        self.admin_hash = admin_hash
        self.oidc = oidc

    async def principal(self, authorization: str | None) -> Principal:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise GatewayError(
                "authentication",
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                code="missing_api_key",
            )
        key = authorization[7:].strip()
        if hmac.compare_digest(_sha(key), self.admin_hash):
            return Principal(role="admin", tenant_id=None, key_id=BOOTSTRAP, name=BOOTSTRAP)
        if self.oidc is not None and looks_like_jwt(key):
            return await self.oidc.principal(key)
        try:
            info = await self.store.lookup_key(key)
        except Exception as exc:  # the database is down: refuse, never guess
            raise GatewayError(
                "unavailable",
                "the key store is unavailable; retry shortly",
                code="database_unavailable",
                retry_after=2,
            ) from exc
        if info is None or info.revoked:
            raise _unknown(key, "The key is unknown or revoked.")
        if info.expires_at is not None and info.expires_at <= datetime.now(UTC):
            raise _unknown(
                key, f"The key expired at {info.expires_at.isoformat()}.", "expired_api_key"
            )
        try:
            await self.store.touch_key(info.id, info.last_used_at)
        except Exception as exc:  # last use is informative: never refuse a valid key for it
            log.warning("could not record the use of key %s: %s", info.id, exc)
        if info.principal is not None:
            role = cast(Role, info.role)
            return Principal(role=role, tenant_id=None, key_id=info.id, name=info.principal)
        tenant_role: Literal["auditor", "tenant"] = (
            "auditor" if info.role == "auditor" else "tenant"
        )
        return Principal(role=tenant_role, tenant_id=info.tenant_id, key_id=info.id)

    async def require(self, authorization: str | None, permission: Permission) -> Principal:
        """The caller, when its role allows ``permission`` (401 without a valid key, 403
        when the role does not allow it)."""
        p = await self.principal(authorization)
        if not allows(p, permission):
            who = f"the {p.role} role" if p.name else f"a {p.role} key"
            raise GatewayError(
                "permission", f"{who} may not do this (needs {permission})", code="forbidden"
            )
        return p

    async def admin(self, authorization: str | None) -> Principal:
        return await self.require(authorization, "operators.write")

    async def auditor(self, authorization: str | None) -> Principal:
        """An operator allowed audit.read (all tenants) or a tenant auditor key (its own
        tenant only)."""
        p = await self.principal(authorization)
        if not (allows(p, "audit.read") or (p.role == "auditor" and p.tenant_id is not None)):
            raise GatewayError(
                "permission", "the audit API needs an auditor or the admin key", code="forbidden"
            )
        return p
