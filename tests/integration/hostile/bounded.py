"""What the bounded-input tests share (test_bounded_inputs.py, test_bounded_prompts.py):
a gateway process with a body limit, OpenAI's error shape, and the latency probe that runs
beside an attack, the same for the real server and for the negative controls (which run
the old code path on an event loop of their own and show the probe sees it block)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.service.process import start_gateway

HEALTH_P99_S = 0.100
ANSWER_S = 1.0
MAX_BODY_BYTES = 2_000_000  # the server's GATEWAY_MAX_BODY_BYTES here


@dataclass
class Server:
    url: str
    key: str
    proc: subprocess.Popen[bytes]

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}


def serve(tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway process on the tiny models, with a body limit of MAX_BODY_BYTES (a test
    module's `server` fixture yields from it)."""
    var = tmp_path_factory.mktemp("hostile")
    proc, url, key = start_gateway(
        tiny_manifest, var, measure_costs="false", max_body_bytes=str(MAX_BODY_BYTES)
    )
    yield Server(url, key, proc)
    proc.terminate()
    proc.wait(timeout=60)


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return err  # type: ignore[no-any-return]


# -- the probe ----------------------------------------------------------------------------


@dataclass
class Probe:
    latencies: list[float]
    attack_s: float
    attack_result: Any

    @property
    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def probe_during(
    attack: Callable[[], Awaitable[Any]], probe: Callable[[], Awaitable[Any]]
) -> Probe:
    """Run `attack` while calling `probe` every 10 ms; the probe's latencies, the attack's
    seconds and result. A latency counts from when the probe was due, so a probe that
    cannot even start while the attack blocks its loop records the block."""
    latencies: list[float] = []
    done = asyncio.Event()

    async def poll() -> None:
        while not done.is_set():
            due = time.perf_counter() + 0.01
            await asyncio.sleep(0.01)
            await probe()
            latencies.append(time.perf_counter() - due)

    poller = asyncio.create_task(poll())
    await asyncio.sleep(0.05)  # the probe runs before the attack starts
    t0 = time.perf_counter()
    try:
        result = await attack()
    finally:
        attack_s = time.perf_counter() - t0
        await asyncio.sleep(0.05)
        done.set()
        await poller
    return Probe(latencies, attack_s, result)


def health_probe(client: httpx.AsyncClient, url: str) -> Callable[[], Awaitable[Any]]:
    async def probe() -> None:
        r = await client.get(f"{url}/health")
        assert r.status_code == 200

    return probe


async def loop_probe() -> None:
    """What /health needs of an in-process server: one turn of its event loop."""
    await asyncio.sleep(0)
