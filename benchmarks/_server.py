"""Start a real gateway process (uvicorn) on the demo models for HTTP benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "models_registry" / "demo" / "manifest.yaml"
ADMIN_KEY = "sk-admin-bench-local"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@dataclass
class Running:
    url: str
    pid: int

    def tenant(self, tenant_id: str, policy: dict[str, object] | None = None) -> str:
        """Create a tenant (with an optional policy document) and return its key."""
        httpx.post(
            f"{self.url}/admin/tenants", json={"id": tenant_id, "name": tenant_id}, headers=ADMIN
        ).raise_for_status()
        if policy is not None:
            httpx.put(
                f"{self.url}/admin/policies/tenants/{tenant_id}", json=policy, headers=ADMIN
            ).raise_for_status()
        r = httpx.post(
            f"{self.url}/admin/tenants/{tenant_id}/keys", json={"role": "tenant"}, headers=ADMIN
        )
        r.raise_for_status()
        return str(r.json()["key"])


def wait_ready(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 300,
    path: str = "/ready", name: str = "gateway",
) -> None:  # fmt: skip
    """Poll GET {url}{path} until 200; raise with the server log's tail if the process exits
    or `timeout` seconds pass (model loading on a busy 2-core machine takes a while). Also
    used by the integration tests' process launcher and for llama-server (_llamacpp.py)."""
    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"{name} did not become ready: " + log.read_text()[-4000:])
        time.sleep(0.5)


@contextmanager
def gateway(module: str = "gateway", cwd: Path | None = None, **env: str) -> Iterator[Running]:
    """A gateway process (`python -m {module}`: benchmarks._phases runs it instrumented),
    from the checkout at `cwd` (this one by default)."""
    if not MANIFEST.exists():
        raise FileNotFoundError(f"{MANIFEST} is missing: train the demo models first")
    with tempfile.TemporaryDirectory() as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        full_env = {
            **os.environ,
            "GATEWAY_PORT": str(port),
            "GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp}/bench.db",
            "GATEWAY_ADMIN_KEY": ADMIN_KEY,
            "GATEWAY_VAR_DIR": tmp,
            "GATEWAY_LOG_LEVEL": "warning",
            "GATEWAY_DEFAULT_REQUESTS_PER_MINUTE": "100000",
            "GATEWAY_DEFAULT_TOKENS_PER_MINUTE": "100000000",
            # The benchmarks repeat their prompts: kept prefixes (engine/batch/prefix.py)
            # would skip prefills that the baselines they compare with do. Off unless a
            # benchmark turns it on to measure it (llamacpp.py).
            "GATEWAY_PREFIX_CACHE": "false",
            **env,
        }
        log = open(f"{tmp}/server.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, "-m", module], env=full_env, stdout=log, stderr=log, cwd=cwd or ROOT
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, Path(f"{tmp}/server.log"))
            yield Running(url, proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()
