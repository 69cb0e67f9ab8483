"""Where the gateway runs torch, seen from inside one process.

    python -m benchmarks._inference_probe reference
    python -m benchmarks._inference_probe gateway [--spoil] VAR_DIR

`reference` loads the target in the main thread of this process and times its steps there.
`gateway` starts the real app (lifespan, SQLite audit, bundled manifest) in-process, serves
what touches torch on the way (standard, speculative with draft v1, a JSON-schema request,
a rollout that loads draft v2), then times the same steps on the inference worker's thread.
`--spoil` first runs one torch op in the event loop's default executor, as loading models
with asyncio.to_thread did (the negative control).
Prints one JSON line: median milliseconds per decode step, process CPU use meanwhile, and
(gateway) the OS threads that are not Python threads and were started after the baseline
by a thread other than the inference thread: each thread pool that competes with it.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from litestar.testing import AsyncTestClient

from benchmarks._server import MANIFEST
from gateway.asgi import create_app
from gateway.engine import LoadedModel
from gateway.settings import Settings
from gateway.speed import load_fast

ADMIN = {"authorization": "Bearer sk-admin-probe-local"}
TARGET = "demo-code-target"
PREFILL, STEPS, ROUNDS = 32, 40, 5


def time_steps(model: LoadedModel) -> dict[str, float]:
    """Median ms of one decode step (1 token, KV cache) over ROUNDS rounds of STEPS steps,
    and CPU seconds / wall seconds of the process over the whole measurement."""
    from transformers import DynamicCache

    per_step: list[float] = []
    c0, w0 = os.times(), time.perf_counter()
    with torch.inference_mode():
        for r in range(ROUNDS + 1):  # the first round warms up
            cache = DynamicCache()
            ids = torch.arange(PREFILL, device=model.device).unsqueeze(0) + 100  # (1, PREFILL)
            model.model(ids, past_key_values=cache, use_cache=True)
            t0 = time.perf_counter()
            for i in range(STEPS):
                step = torch.tensor([[200 + i]], device=model.device)  # (1, 1)
                model.model(step, past_key_values=cache, use_cache=True)
            if r:
                per_step.append((time.perf_counter() - t0) / STEPS * 1000)
    c1, w1 = os.times(), time.perf_counter()
    cpu = (c1.user - c0.user + c1.system - c0.system) / (w1 - w0)
    return {"ms_per_step": statistics.median(per_step), "cpu": cpu}


def reference() -> dict[str, float]:
    entry = next(e for e in _manifest_models() if e["name"] == TARGET)
    return time_steps(load_fast(str(MANIFEST.parent / entry["path"]), draft_vocab=False))


def _manifest_models() -> list[dict[str, Any]]:
    import yaml

    return list(yaml.safe_load(MANIFEST.read_text())["models"])


def os_threads() -> dict[int, str]:
    """This process's OS threads: native id -> the name the kernel holds (``comm``)."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            names[int(tid)] = f.read().strip()
    return names


def foreign_pools(before: set[int], inference: str) -> list[str]:
    """Native threads (no Python thread behind them: libgomp's workers, other libraries'
    pools) started since ``before`` by a thread not named ``inference``. A thread inherits
    its creator's OS name, and the worker names its thread before it touches torch."""
    python = {t.native_id for t in threading.enumerate()}
    return [
        f"{tid}:{name}"
        for tid, name in os_threads().items()
        if tid not in before and tid not in python and name != inference[:15]
    ]


async def gateway(var: Path, spoil: bool) -> dict[str, Any]:
    settings = Settings.from_env(  # GATEWAY_* from the environment (torch threads), then:
        database_url=f"sqlite+aiosqlite:///{var}/probe.db",
        admin_key="sk-admin-probe-local",
        models=str(MANIFEST),
        var_dir=str(var),
        log_level="warning",
    )
    app = create_app(settings)
    before = set(os_threads())
    async with AsyncTestClient(app, timeout=120) as client:
        await _serve_some(client)
        services = app.state.services
        if spoil:
            await asyncio.to_thread(lambda: torch.ones(1 << 22).sum())
        _, engine = await services.pool.target(TARGET)
        timed = await services.worker.call(lambda: time_steps(engine.target))
        name = services.worker.thread_name
        return {**timed, "inference_thread": name, "foreign_pools": foreign_pools(before, name)}


async def _serve_some(client: AsyncTestClient[Any]) -> None:
    """What touches torch on the way to a steady state: requests of every kind, a rollout."""

    async def ok(r: Any) -> Any:
        assert r.status_code < 300, r.text
        return r.json()

    await ok(await client.post("/admin/tenants", json={"id": "p", "name": "p"}, headers=ADMIN))
    r = await client.post("/admin/tenants/p/keys", json={"role": "tenant"}, headers=ADMIN)
    key = (await ok(r))["key"]
    auth = {"authorization": f"Bearer {key}"}
    base = {"model": TARGET, "prompt": "def fib(n):", "max_tokens": 8, "temperature": 0}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    bodies = [
        {**base, "decoding": {"mode": "standard"}},
        {**base, "decoding": {"mode": "speculative", "proposer": "draft"}},
        {
            "model": TARGET,
            "messages": [{"role": "user", "content": "json"}],
            "max_tokens": 8,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            },
        },
    ]
    for body in bodies:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        await ok(await client.post(path, json=body, headers=auth))
    rollout = {"target": TARGET, "draft": "demo-code-draft", "version": "2", "canary_percent": 50}
    await ok(await client.post("/admin/rollouts", json=rollout, headers=ADMIN))
    await ok(await client.post("/v1/completions", json=bodies[1], headers=auth))


if __name__ == "__main__":
    if sys.argv[1] == "reference":
        result = reference()
    else:
        result = asyncio.run(gateway(Path(sys.argv[-1]), spoil="--spoil" in sys.argv))
    print(json.dumps(result), flush=True)
