"""The gateway over HTTP against the engine in a plain script, and tokens/s under concurrency.

Same demo pair, same code prompts, same decoding (greedy, 128 new tokens; standard, and
speculative with draft v2 as the gateway's policy allows a client to ask) measured two ways:
the engine called from the main thread of its own process (benchmarks/_http_engine.py), and
a real gateway process (uvicorn + SQLite audit) called over HTTP, one request at a time.
The two never run at the same time: each round starts one process, measures it, stops it,
then the other, alternating which goes first. Each side's CPU use over its decoding window
(process CPU seconds / wall seconds) is reported; on the 2-core machine both should be near
200%. The last round's gateway then serves 1, 4 and 8 concurrent clients on the speculative
configuration (aggregate completion tokens / wall time).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks._server import MANIFEST, Running, gateway

PROMPTS = Path(__file__).resolve().parent / "prompts" / "code.jsonl"
MODEL = "demo-code-target"
NEW_TOKENS = 128
MODES: dict[str, dict[str, Any]] = {
    "standard": {"mode": "standard"},
    "speculative": {"mode": "speculative", "proposer": "draft"},
}
CLIENTS = (1, 4, 8)


def _prompts(quick: bool) -> list[str]:
    lines = [json.loads(x)["prompt"] for x in PROMPTS.read_text().splitlines() if x.strip()]
    return lines[:3] if quick else lines


def _engine_round(prompts: list[str]) -> dict[str, Any]:
    args = json.dumps({"prompts": prompts, "new_tokens": NEW_TOKENS, "modes": MODES})
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks._http_engine", args],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _post(client: httpx.Client, key: str, prompt: str, decoding: dict[str, Any]) -> int:
    """One completion on a kept-alive connection (as the openai client keeps one)."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "decoding": decoding,
    }
    r = client.post("/v1/completions", json=body, headers={"authorization": f"Bearer {key}"})
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


def _manifest(folder: Path, version: str = "2") -> Path:
    """The demo manifest with draft `version` as the only draft (the bundled one serves v1
    as the baseline; these benchmarks decode with v2), so that both sides decode with the
    same pair."""
    models = yaml.safe_load(MANIFEST.read_text())["models"]
    keep = [m for m in models if m["role"] == "target" or str(m["version"]) == version]
    for m in keep:
        m["path"] = str(MANIFEST.parent / m["path"])
    path = folder / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": keep}))
    return path


def _gateway_round(prompts: list[str], concurrency: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        gateway(
            GATEWAY_MAX_ACTIVE="8",
            GATEWAY_QUEUE_CAPACITY="64",
            GATEWAY_MODELS=str(_manifest(Path(tmp))),
        ) as gw,
        httpx.Client(base_url=gw.url, timeout=600) as client,
    ):
        key = gw.tenant("bench", {"client_override": {"allow": True}})
        out.update(measure_modes(gw, client, key, prompts))
        if concurrency:
            out["concurrent_clients_tokens_per_s"] = _concurrency(gw, key, prompts)
    return out


def measure_modes(
    gw: Running, client: httpx.Client, key: str, prompts: list[str]
) -> dict[str, dict[str, float]]:
    """Per mode: tokens/s of the prompts one after another, and the gateway's CPU use."""
    out = {}
    for name, decoding in MODES.items():
        _post(client, key, prompts[0], decoding)  # warm-up (the draft loads on first use)
        c0, t0 = _cpu_seconds(gw.pid), time.perf_counter()
        tokens = sum(_post(client, key, p, decoding) for p in prompts)
        wall = time.perf_counter() - t0
        out[name] = {"tokens_per_s": tokens / wall, "cpu": (_cpu_seconds(gw.pid) - c0) / wall}
    return out


def _concurrency(gw: Running, key: str, prompts: list[str]) -> dict[str, float]:
    result: dict[str, float] = {}
    for clients in CLIENTS:
        work = [prompts[i % len(prompts)] for i in range(max(clients, len(prompts)))]
        limits = httpx.Limits(max_connections=clients)
        with httpx.Client(base_url=gw.url, timeout=600, limits=limits) as client:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                tokens = sum(pool.map(lambda p: _post(client, key, p, MODES["speculative"]), work))
        result[str(clients)] = tokens / (time.perf_counter() - t0)
    return result


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    prompts = _prompts(quick)
    rounds = 1 if quick else 3
    engine: list[dict[str, Any]] = []
    http: list[dict[str, Any]] = []
    concurrency: dict[str, float] = {}
    for i in range(rounds):
        last = i == rounds - 1
        if i % 2 == 0:
            engine.append(_engine_round(prompts))
            http.append(_gateway_round(prompts, concurrency=last))
        else:
            http.append(_gateway_round(prompts, concurrency=last))
            engine.append(_engine_round(prompts))
        print(f"   round {i + 1}/{rounds}: {_round_line(engine[-1], http[-1])}", flush=True)
    concurrency = http[-1].pop("concurrent_clients_tokens_per_s")

    def median(side: list[dict[str, Any]], mode: str, key: str) -> float:
        return statistics.median(r[mode][key] for r in side)

    engine_tps = {m: median(engine, m, "tokens_per_s") for m in MODES}
    http_tps = {m: median(http, m, "tokens_per_s") for m in MODES}
    return {
        "setup": {
            "prompts": len(prompts),
            "new_tokens": NEW_TOKENS,
            "rounds": rounds,
            "greedy": True,
            "draft": "demo-code-draft@2",
            "cores": os.cpu_count(),
            "sides": "engine in a plain script's main thread vs gateway process over HTTP, "
            "separate processes, never alive together, order alternating by round",
        },
        "engine_tokens_per_s": engine_tps,
        "http_tokens_per_s": http_tps,
        "http_over_engine": {m: http_tps[m] / engine_tps[m] for m in MODES},
        "http_over_engine_by_round": {
            m: [
                h[m]["tokens_per_s"] / e[m]["tokens_per_s"]
                for e, h in zip(engine, http, strict=True)
            ]
            for m in MODES
        },
        "engine_cpu": {m: median(engine, m, "cpu") for m in MODES},
        "http_cpu": {m: median(http, m, "cpu") for m in MODES},
        "goal_http_over_engine": 0.95,
        "concurrent_clients_tokens_per_s": concurrency,
    }


def _round_line(e: dict[str, Any], h: dict[str, Any]) -> str:
    return ", ".join(
        f"{m} engine {e[m]['tokens_per_s']:.1f} tok/s ({e[m]['cpu']:.0%} CPU), "
        f"http {h[m]['tokens_per_s']:.1f} ({h[m]['cpu']:.0%})"
        for m in MODES
    )
