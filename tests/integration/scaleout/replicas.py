"""Several real gateway processes (`python -m gateway`) on one database and one Redis,
started at the same moment, as replicas behind a load balancer would be."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks._server import wait_ready
from tests.integration.service.harness import ADMIN_KEY
from tests.integration.service.process import free_port


@dataclass
class Replica:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


@contextmanager
def replicas(
    n: int, manifest: Path, var: Path, database_url: str, **settings: str
) -> Iterator[list[Replica]]:
    """Start ``n`` gateways together (each migrates on start: the advisory lock serializes
    them), wait until every one is ready, stop them all afterwards. ``settings`` are
    GATEWAY_* variables without the prefix."""
    started: list[Replica] = []
    try:
        for i in range(n):
            port, home = free_port(), var / f"replica{i}"
            home.mkdir(parents=True, exist_ok=True)
            env = {
                **os.environ,
                "GATEWAY_PORT": str(port),
                "GATEWAY_DATABASE_URL": database_url,
                "GATEWAY_ADMIN_KEY": ADMIN_KEY,
                "GATEWAY_MODELS": str(manifest),
                "GATEWAY_VAR_DIR": str(home),
                "GATEWAY_LOG_LEVEL": "warning",
                "GATEWAY_MEASURE_COSTS": "false",
                "GATEWAY_TORCH_THREADS": "1",
                **{f"GATEWAY_{k.upper()}": v for k, v in settings.items()},
            }
            log = home / "server.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "gateway"], env=env, stdout=out, stderr=out
                )
            started.append(Replica(proc, f"http://127.0.0.1:{port}", log))
        for r in started:
            wait_ready(r.url, r.proc, r.log)
        yield started
    finally:
        for r in started:
            r.proc.terminate()
        for r in started:
            try:
                r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                r.proc.kill()
