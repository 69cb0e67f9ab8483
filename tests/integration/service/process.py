"""Start `python -m gateway` as a real process on the tiny models and wait until ready."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from benchmarks._server import wait_ready
from tests.integration.service.harness import ADMIN, ADMIN_KEY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(
    manifest: Path, var: Path, env_extra: dict[str, str] | None = None, **settings: str
) -> tuple[subprocess.Popen[bytes], str, str]:
    """Returns (process, base url, a tenant key for tenant "real"). Logs go to var/server.log;
    extra settings are GATEWAY_* variables given without the prefix (queue_capacity="3")."""
    port = free_port()
    env = {
        **os.environ,
        "GATEWAY_PORT": str(port),
        "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{var}/gateway.db",
        "GATEWAY_ADMIN_KEY": ADMIN_KEY,
        "GATEWAY_MODELS": str(manifest),
        "GATEWAY_VAR_DIR": str(var),
        "GATEWAY_LOG_LEVEL": "warning",
        **{f"GATEWAY_{k.upper()}": v for k, v in settings.items()},
        **(env_extra or {}),
    }
    log = var / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway"], env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, log)
    return proc, url, tenant_key(url, "real")


def tenant_key(url: str, tenant: str) -> str:
    """A tenant key for a new tenant `tenant` of the gateway at `url`."""
    httpx.post(f"{url}/admin/tenants", json={"id": tenant, "name": tenant.title()}, headers=ADMIN)
    key = httpx.post(
        f"{url}/admin/tenants/{tenant}/keys", json={"role": "tenant"}, headers=ADMIN
    ).json()["key"]
    return str(key)
