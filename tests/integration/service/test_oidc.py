"""Operators signed in at an identity provider: a JWT signed by a key in the configured JWKS
acts with the role its claim names, audited as oidc:<sub>; expired, foreign-audience,
wrongly signed and role-less tokens are refused (401 / 403, OpenAI's error shape)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.integration.service.harness import ADMIN, sqlite_gateway

ISSUER, AUDIENCE = "https://idp.example", "spec-gateway"


def keypair() -> Any:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def token(key: Any, kid: str = "k1", **claims: Any) -> str:
    now = int(time.time())
    body = {"sub": "dana", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 60, **claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": kid})


def bearer(t: str) -> dict[str, str]:
    return {"authorization": f"Bearer {t}"}


async def test_tokens_act_with_their_claimed_role(tiny_manifest: Path, tmp_path: Path) -> None:
    key, stranger = keypair(), keypair()
    jwk = {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": "k1", "use": "sig"}
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk]}))
    settings = {
        "oidc_jwks": str(jwks),
        "oidc_issuer": ISSUER,
        "oidc_audience": AUDIENCE,
        "oidc_role_claim": "realm_access.roles",
    }
    async with sqlite_gateway(tiny_manifest, tmp_path, **settings) as g:
        author = token(key, realm_access={"roles": ["offline", "policy-author"]})
        doc = {"speculation": {"k": {"min": 1, "max": 2}}}
        url = f"/admin/policies/tenants/{g.tenant}"
        r = await g.client.put(url, json=doc, headers=bearer(author))
        assert r.status_code == 200, r.text
        r = await g.client.post("/admin/rollouts/1/pause", headers=bearer(author))
        assert r.status_code == 403, r.text
        events = (await g.client.get("/audit/events", headers=ADMIN)).json()["data"]
        mine = [e["actor"] for e in events if e["subject"] == g.tenant]
        assert "oidc:dana" in mine

        refused = {
            "expired": (
                token(key, exp=int(time.time()) - 5, realm_access={"roles": ["admin"]}),
                401,
                "expired_token",
            ),
            "audience": (
                token(key, aud="other", realm_access={"roles": ["admin"]}),
                401,
                "invalid_token",
            ),
            "issuer": (
                token(key, iss="https://evil", realm_access={"roles": ["admin"]}),
                401,
                "invalid_token",
            ),
            "signature": (token(stranger, realm_access={"roles": ["admin"]}), 401, "invalid_token"),
            "kid": (token(key, kid="k9", realm_access={"roles": ["admin"]}), 401, "invalid_token"),
            "no role": (token(key, realm_access={"roles": ["offline"]}), 403, "forbidden"),
        }
        for why, (t, status, code) in refused.items():
            r = await g.client.get("/admin/tenants", headers=bearer(t))
            assert r.status_code == status, (why, r.text)
            assert r.json()["error"]["code"] == code, why
        # API keys keep working beside tokens
        assert (await g.client.get("/admin/tenants", headers=ADMIN)).status_code == 200
        assert (await g.complete(max_tokens=2)).status_code == 200
