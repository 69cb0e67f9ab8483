"""Issue 44, the smaller holes in authentication, each closed and each with its attack:

- an operator rotates its own expiring key into one that never expires;
- a rotation racing a disable leaves the disabled operator a working key, and lookup
  accepts a disabled operator's key;
- OIDC without issuer / audience checks, over a plain-http JWKS, refetching on every
  unknown key id, keeping a key the provider removed;
- the database password in the start line;
- the sample ``CHANGE_ME`` admin key accepted;
- each unauthenticated ``POST /v1/*`` appended to the audit chain.

Real parts: SQLite and PostgreSQL stores, the app with its tiny models, a JWKS served over
HTTP from a local server.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from litestar.testing import AsyncTestClient

import gateway.__main__ as entry
from gateway.asgi import create_app
from gateway.database import Database
from gateway.serving import make_oidc
from gateway.serving.errors import GatewayError
from gateway.serving.oidc import OidcConfig, OidcVerifier
from gateway.settings import ROOT, Settings
from tests.integration.service.harness import ADMIN, sqlite_gateway
from tests.pg import fresh_database

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(params=BACKENDS)
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path}/auth.db"
    else:
        async with fresh_database("auth") as url:
            yield url


# -- operator keys -----------------------------------------------------------------------


async def test_rotation_never_lengthens_a_key(tiny_manifest: Path, tmp_path: Path) -> None:
    """Attack: an operator with a key that expires in an hour rotates it (with or without
    asking for a long life) and gets a key that never expires. Old code: the successor's
    ``expires_at`` was None / the one asked."""
    async with sqlite_gateway(tiny_manifest, tmp_path) as g:
        r = await g.client.post(
            "/admin/operators",
            json={"name": "temp", "role": "rollout-operator", "expires_in_s": 3600},
            headers=ADMIN,
        )
        assert r.status_code == 201, r.text
        first = r.json()["key"]
        ends = datetime.fromisoformat(first["expires_at"])
        key_id, key = first["id"], first["key"]
        for ask in ({}, {"expires_in_s": 10 * 365 * 86400}):
            r = await g.client.post(
                f"/admin/keys/{key_id}/rotate", json={"grace_s": 0, **ask}, headers=bearer(key)
            )
            assert r.status_code == 201, r.text
            assert r.json()["expires_at"] is not None, "rotated into a key that never expires"
            assert datetime.fromisoformat(r.json()["expires_at"]) == ends
            key_id, key = r.json()["id"], r.json()["key"]
        listed = {
            k["id"]: k for k in (await g.client.get("/admin/keys", headers=ADMIN)).json()["data"]
        }
        assert datetime.fromisoformat(listed[key_id]["expires_at"]) == ends
        # asking for a shorter life is honoured
        r = await g.client.post(
            f"/admin/keys/{key_id}/rotate", json={"expires_in_s": 60}, headers=bearer(key)
        )
        assert r.status_code == 201, r.text
        assert datetime.fromisoformat(r.json()["expires_at"]) < ends


async def test_a_disabled_operators_key_is_refused_by_lookup(db_url: str) -> None:
    """A key row that escaped the revocation (issued for the principal after it was
    disabled) must not authenticate. Old code: lookup looked at the key row only."""
    store = await Database.connect(db_url, upgrade=True)
    try:
        await store.create_principal("mallory", "admin", actor="admin")
        assert await store.disable_principal("mallory", actor="admin")
        _, secret = await store.create_key(None, "admin", principal="mallory")
        info = await store.lookup_key(secret)
        assert info is not None and info.revoked
    finally:
        await store.close()


async def test_rotation_and_disable_are_one_after_the_other(db_url: str) -> None:
    """Attack: rotate a key while an admin disables its operator. The rotation is made to
    pause just before it inserts the successor, while another replica disables the
    operator. Old code (checks and insert in separate transactions): the disable finished
    in the pause and the successor was issued unrevoked to a disabled operator."""
    store = await Database.connect(db_url, upgrade=True)
    other = await Database.connect(db_url)
    try:
        _, key_id, _ = await store.create_principal("eve", "admin", actor="admin")
        create_key = store.create_key
        disabling: list[asyncio.Task[bool]] = []

        async def paused_create_key(*args: Any, **kwargs: Any) -> tuple[str, str]:
            if kwargs.get("action") == "key.rotated":
                disabling.append(asyncio.create_task(other.disable_principal("eve", actor="admin")))
                await asyncio.sleep(0.5)  # time enough for an unhindered disable
            return await create_key(*args, **kwargs)

        store.create_key = paused_create_key  # type: ignore[method-assign]
        got = await store.rotate_key(key_id, timedelta(minutes=5), actor="eve")
        (task,) = disabling
        assert await asyncio.wait_for(task, 30)
        assert got is not None  # the rotation came first; the disable then revoked both
        keys = await store.list_keys(principal="eve")
        assert {k["id"] for k in keys} == {key_id, got[0]}
        assert all(k["revoked_at"] is not None for k in keys), keys
        # and after the disable, no rotation: the principal has no key to rotate into
        assert await store.rotate_key(key_id, timedelta(0), actor="admin") is None
        assert (await store.verify())["admin_events"]["ok"]
    finally:
        await other.close()
        await store.close()


# -- OIDC ----------------------------------------------------------------------------------

ISSUER, AUDIENCE = "https://idp.example", "spec-gateway"


class Jwks:
    """A provider's jwks_uri on 127.0.0.1: serves ``keys``, counts the fetches."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.fetches = 0
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                jwks.fetches += 1
                body = json.dumps({"keys": jwks.keys}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def publish(self, **pairs: Any) -> None:
        self.keys = [
            {**json.loads(RSAAlgorithm.to_jwk(k.public_key())), "kid": kid, "use": "sig"}
            for kid, k in pairs.items()
        ]


@pytest.fixture(scope="module")
def rsa_keys() -> list[Any]:
    return [rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2)]


@pytest.fixture
def provider() -> Iterator[Jwks]:
    p = Jwks()
    yield p
    p.server.shutdown()
    p.server.server_close()


def token(key: Any, kid: str, **claims: Any) -> str:
    now = int(time.time())
    body = {"sub": "dana", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 60, **claims}
    return jwt.encode({**body, "roles": ["admin"]}, key, algorithm="RS256", headers={"kid": kid})


def test_oidc_needs_issuer_audience_and_https_unless_told(
    tmp_path: Path, rsa_keys: list[Any]
) -> None:
    """Old code started with neither issuer nor audience (any token the provider signs for
    any application passed) and fetched keys over http:// from anywhere."""
    jwks = tmp_path / "jwks.json"
    jwk = {**json.loads(RSAAlgorithm.to_jwk(rsa_keys[0].public_key())), "kid": "k1"}
    jwks.write_text(json.dumps({"keys": [jwk]}))
    with pytest.raises(ValueError, match="GATEWAY_OIDC_ISSUER and GATEWAY_OIDC_AUDIENCE"):
        make_oidc(Settings(oidc_jwks=str(jwks)))
    with pytest.raises(ValueError, match="GATEWAY_OIDC_AUDIENCE"):
        make_oidc(Settings(oidc_jwks=str(jwks), oidc_issuer=ISSUER))
    for url in ("http://idp.example/jwks", "http://10.0.0.5/jwks", "ftp://idp/jwks"):
        with pytest.raises(ValueError, match="https://"):
            OidcVerifier(OidcConfig(url, issuer=ISSUER, audience=AUDIENCE))
    # allowed: https anywhere, http to loopback, and the documented opt-out
    OidcVerifier(OidcConfig("https://idp.example/jwks", issuer=ISSUER, audience=AUDIENCE))
    OidcVerifier(OidcConfig("http://[::1]:9/jwks", issuer=ISSUER, audience=AUDIENCE))
    OidcVerifier(OidcConfig("http://localhost:9/jwks", issuer=ISSUER, audience=AUDIENCE))
    OidcVerifier(OidcConfig("https://idp.example/jwks", allow_unchecked_claims=True))


async def test_oidc_refuses_tokens_missing_issuer_or_audience(
    provider: Jwks, rsa_keys: list[Any]
) -> None:
    provider.publish(k1=rsa_keys[0])
    v = OidcVerifier(OidcConfig(provider.url, issuer=ISSUER, audience=AUDIENCE))
    assert (await v.principal(token(rsa_keys[0], "k1"))).name == "oidc:dana"
    now = int(time.time())
    for missing in ("iss", "aud"):
        body = {"sub": "dana", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 60}
        del body[missing]
        t = jwt.encode({**body, "roles": ["admin"]}, rsa_keys[0], "RS256", headers={"kid": "k1"})
        with pytest.raises(GatewayError) as err:
            await v.principal(t)
        assert err.value.kind == "authentication", missing


async def test_oidc_unknown_kids_refetch_at_a_bounded_rate(
    provider: Jwks, rsa_keys: list[Any]
) -> None:
    """Attack: a flood of tokens with made-up key ids. Old code (PyJWKClient) fetched the
    JWKS once per token: the gateway hammered the provider on the attacker's behalf."""
    provider.publish(k1=rsa_keys[0])
    v = OidcVerifier(OidcConfig(provider.url, issuer=ISSUER, audience=AUDIENCE))
    assert (await v.principal(token(rsa_keys[0], "k1"))).name == "oidc:dana"
    before = provider.fetches
    for i in range(20):
        with pytest.raises(GatewayError) as refused:
            await v.principal(token(rsa_keys[1], f"made-up-{i}"))
        assert refused.value.code == "invalid_token"
    assert provider.fetches - before <= 1, provider.fetches - before


async def test_oidc_drops_a_key_the_provider_removed(provider: Jwks, rsa_keys: list[Any]) -> None:
    """The provider rotates its signing key (k1 out, k2 in). A token signed with k2 makes
    the gateway read the set again; from then on k1's tokens are refused. Old code kept
    every key it had seen (cached per kid) until a restart."""
    old_key, new_key = rsa_keys
    provider.publish(k1=old_key)
    v = OidcVerifier(OidcConfig(provider.url, issuer=ISSUER, audience=AUDIENCE))
    assert (await v.principal(token(old_key, "k1"))).name == "oidc:dana"
    provider.publish(k2=new_key)
    assert (await v.principal(token(new_key, "k2"))).name == "oidc:dana"
    for _ in range(3):
        with pytest.raises(GatewayError) as refused:
            await v.principal(token(old_key, "k1"))
        assert refused.value.code == "invalid_token"
    assert provider.fetches == 2


async def test_a_jwks_file_is_read_again(tmp_path: Path, rsa_keys: list[Any]) -> None:
    """A JWKS file: old code read it once at start and kept its keys until a restart."""
    old_key, new_key = rsa_keys
    path = tmp_path / "jwks.json"

    def publish(kid: str, key: Any) -> None:
        jwk = {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": kid}
        path.write_text(json.dumps({"keys": [jwk]}))

    publish("k1", old_key)
    v = OidcVerifier(OidcConfig(str(path), issuer=ISSUER, audience=AUDIENCE))
    assert (await v.principal(token(old_key, "k1"))).name == "oidc:dana"
    publish("k2", new_key)
    assert (await v.principal(token(new_key, "k2"))).name == "oidc:dana"
    with pytest.raises(GatewayError):
        await v.principal(token(old_key, "k1"))


# -- start-up: secrets in the start line, the sample admin key -------------------------


class Started(Exception):
    """Raised by the stand-in for uvicorn.run: the gateway got as far as serving."""


@pytest.fixture
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() without loading models or serving: create_app and uvicorn's Server.run
    (which uvicorn.run and the gateway's own server call) stubbed."""
    monkeypatch.setattr(entry, "create_app", lambda settings: object())

    def run(*args: Any, **kwargs: Any) -> None:
        raise Started

    monkeypatch.setattr(entry.uvicorn.Server, "run", run)
    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)


def test_the_start_line_masks_passwords(
    no_serving: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Old code printed ``database: postgresql+asyncpg://gateway:<password>@...``."""
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "sk-admin-" + "x" * 24)
    monkeypatch.setenv(
        "GATEWAY_DATABASE_URL", "postgresql+asyncpg://gateway:pg-s3cret%21@db:5432/gateway"
    )
    monkeypatch.setenv("GATEWAY_REDIS_URL", "redis://:redis-s3cret@redis:6379/0")
    with pytest.raises(Started):
        entry.main()
    out = capsys.readouterr()
    shown = out.out + out.err
    assert "gateway:***@db:5432/gateway" in shown and ":***@redis:6379/0" in shown
    assert "s3cret" not in shown
    assert entry.masked_url("not a url://u:p@h/x") == "not a url://u:***@h/x"


def _sample_admin_keys() -> list[str]:
    """The placeholders the samples ship (deploy/ secret, the README's export line)."""
    secret = yaml.safe_load((ROOT / "deploy" / "base" / "secret.yaml").read_text())
    readme = (ROOT / "README.md").read_text()
    assert "sk-admin-..." in readme
    return [secret["stringData"]["GATEWAY_ADMIN_KEY"], "sk-admin-...", "change-me", "short-key-123"]


@pytest.mark.parametrize("key", _sample_admin_keys())
def test_a_sample_or_short_admin_key_stops_the_start(
    key: str,
    no_serving: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Old code served with GATEWAY_ADMIN_KEY=CHANGE_ME (deploy/base/secret.yaml)."""
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", key)
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == entry.EXIT_BAD_SETTINGS
    err = capsys.readouterr().err
    assert "GATEWAY_ADMIN_KEY" in err and "refusing to start" in err


async def test_the_app_refuses_a_sample_admin_key_too(tiny_manifest: Path, tmp_path: Path) -> None:
    """Started another way (uvicorn gateway.asgi:create_app), the services refuse it."""
    settings = Settings(
        admin_key="CHANGE_ME", models=str(tiny_manifest), var_dir=str(tmp_path),
        database_url=f"sqlite+aiosqlite:///{tmp_path}/g.db", log_level="warning",
    )  # fmt: skip
    with pytest.raises(BaseException) as caught:  # the lifespan's error, in a group
        async with AsyncTestClient(create_app(settings)):
            pass
    errors, found = [caught.value], []
    while errors:
        e = errors.pop()
        errors += getattr(e, "exceptions", [])
        found += [str(e)] if isinstance(e, ValueError) else []
    assert any("GATEWAY_ADMIN_KEY is the sample placeholder" in m for m in found), caught.value


# -- unauthenticated calls -----------------------------------------------------------------


async def test_unauthenticated_calls_are_counted_not_chained(
    tiny_manifest: Path, tmp_path: Path
) -> None:
    """Attack: anyone without a key POSTs /v1/* in a loop to grow the permanent audit
    chain. Old code appended a chained 401 record per call."""
    async with sqlite_gateway(tiny_manifest, tmp_path) as g:
        store = g.services.store
        chained = (await store.verify())["checked"]
        body = {"model": "tiny-target", "prompt": "x", "max_tokens": 1}
        for headers in ({}, bearer("sk-wrong"), bearer("sk-" + "a" * 40)) * 3:
            r = await g.client.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401, r.text
        r = await g.client.post("/v1/chat/completions", json=body, headers=bearer("nope"))
        assert r.status_code == 401
        assert (await store.verify())["checked"] == chained, "unauthenticated calls chained"
        assert [x for x in await g.records() if x["status"] == 401] == []
        metrics = (await g.client.get("/metrics")).text
        assert 'gateway_unauthenticated_requests_total{endpoint="completions"} 9.0' in metrics
        assert 'gateway_unauthenticated_requests_total{endpoint="chat.completions"} 1.0' in metrics
        # an authenticated refusal is still audited
        r = await g.client.post("/v1/completions", json={"prompt": "x"}, headers=g.auth)
        assert r.status_code == 400, r.text
        refused = [x for x in await g.records() if x["status"] == 400]
        assert len(refused) == 1 and refused[0]["tenant_id"] == g.tenant
        assert (await store.verify())["checked"] == chained + 1
