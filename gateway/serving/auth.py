"""Bearer keys -> principals: the bootstrap admin key, tenant keys and auditor keys.

Keys are stored hashed (SHA-256); the admin key comes from GATEWAY_ADMIN_KEY or is
generated on first start, printed once, and only its hash is kept on disk.
"""

from __future__ import annotations

import hmac
import secrets
import sys
from pathlib import Path
from typing import Literal

from gateway.database import Database
from gateway.database import sha256_text as _sha
from gateway.serving.commands import Principal
from gateway.serving.errors import GatewayError


def bootstrap_admin_hash(admin_key: str | None, var_dir: str) -> str:
    """The admin key's hash; generates and prints a key on first start when none is set."""
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


class Authenticator:
    def __init__(self, store: Database, admin_hash: str) -> None:
        self.store = store
        self.admin_hash = admin_hash

    async def principal(self, authorization: str | None) -> Principal:
        if not authorization or not authorization.lower().startswith("bearer "):
            raise GatewayError(
                "authentication",
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
                code="missing_api_key",
            )
        key = authorization[7:].strip()
        if hmac.compare_digest(_sha(key), self.admin_hash):
            return Principal(role="admin", tenant_id=None, key_id="admin")
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
            shown = key[:6] + "..." + key[-4:] if len(key) > 12 else "***"
            raise GatewayError(
                "authentication",
                f"Incorrect API key provided: {shown}. The key is unknown or revoked.",
                code="invalid_api_key",
            )
        role: Literal["auditor", "tenant"] = "auditor" if info.role == "auditor" else "tenant"
        return Principal(role=role, tenant_id=info.tenant_id, key_id=info.id)

    async def admin(self, authorization: str | None) -> Principal:
        p = await self.principal(authorization)
        if p.role != "admin":
            raise GatewayError("permission", "this endpoint needs the admin key", code="forbidden")
        return p

    async def auditor(self, authorization: str | None) -> Principal:
        """The admin (all tenants) or an auditor key (its own tenant only)."""
        p = await self.principal(authorization)
        if p.role not in ("admin", "auditor"):
            raise GatewayError(
                "permission", "the audit API needs an auditor or the admin key", code="forbidden"
            )
        return p
