"""HTTP end-to-end over in-process engine tokens/s, and aggregate tokens/s under concurrency.

Same demo pair, same code prompts, same decoding (greedy, 128 new tokens, speculative with
draft v2 and standard) measured two ways in one run: the engine called in this process, and
a real gateway process (uvicorn + SQLite audit) called over HTTP. Then 1, 4 and 8 concurrent
HTTP clients on the speculative configuration (aggregate completion tokens / wall time).
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks._server import MANIFEST, gateway
from gateway.engine import DecodeRequest, Engine, SamplingParams, load_model

PROMPTS = Path(__file__).resolve().parent / "prompts" / "code.jsonl"
MODEL = "demo-code-target"
NEW_TOKENS = 128
MODES = {
    "standard": {"mode": "standard"},
    "speculative": {"mode": "speculative", "proposer": "draft"},
}


def _prompts(quick: bool) -> list[str]:
    lines = [json.loads(x)["prompt"] for x in PROMPTS.read_text().splitlines() if x.strip()]
    return lines[:3] if quick else lines


def _in_process(prompts: list[str], runs: int) -> dict[str, float]:
    entries = {(e["name"], e["version"]): e for e in yaml.safe_load(MANIFEST.read_text())["models"]}
    target = load_model(str(MANIFEST.parent / entries[(MODEL, "1")]["path"]), draft_vocab=False)
    draft = load_model(str(MANIFEST.parent / entries[("demo-code-draft", "2")]["path"]))
    engine = Engine(target)
    ids = [tuple(target.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    out: dict[str, float] = {}
    for name, decoding in MODES.items():
        speculative = decoding["mode"] == "speculative"
        tps = []
        for _ in range(runs):
            tokens, t0 = 0, time.perf_counter()
            for p in ids:
                req = DecodeRequest(
                    prompt_ids=p,
                    sampling=SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS),
                    mode="speculative" if speculative else "standard",
                    proposer="draft" if speculative else None,
                    k_min=1,
                    k_max=8,
                )
                tokens += len(engine.run(req, draft=draft if speculative else None).token_ids)
            tps.append(tokens / (time.perf_counter() - t0))
        out[name] = statistics.median(tps)
    return out


def _post(url: str, key: str, prompt: str, decoding: dict[str, Any]) -> int:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "decoding": decoding,
    }
    r = httpx.post(
        f"{url}/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=600
    )
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    prompts = _prompts(quick)
    runs = 1 if quick else 3
    engine_tps = _in_process(prompts, runs)
    http_tps: dict[str, float] = {}
    concurrency: dict[str, float] = {}
    with gateway(GATEWAY_MAX_ACTIVE="8", GATEWAY_QUEUE_CAPACITY="64") as gw:
        key = gw.tenant("bench", {"client_override": {"allow": True}})
        _post(gw.url, key, prompts[0], MODES["speculative"])  # warm-up (draft load)
        for name, decoding in MODES.items():
            tps = []
            for _ in range(runs):
                t0 = time.perf_counter()
                tokens = sum(_post(gw.url, key, p, decoding) for p in prompts)
                tps.append(tokens / (time.perf_counter() - t0))
            http_tps[name] = statistics.median(tps)
        for clients in (1, 4, 8):
            work = [prompts[i % len(prompts)] for i in range(max(clients, len(prompts)))]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                tokens = sum(pool.map(lambda p: _post(gw.url, key, p, MODES["speculative"]), work))
            concurrency[str(clients)] = tokens / (time.perf_counter() - t0)
    return {
        "setup": {
            "prompts": len(prompts),
            "new_tokens": NEW_TOKENS,
            "runs": runs,
            "greedy": True,
            "draft": "demo-code-draft@2",
        },
        "engine_tokens_per_s": engine_tps,
        "http_tokens_per_s": http_tps,
        "http_over_engine": {k: http_tps[k] / engine_tps[k] for k in MODES},
        "goal_http_over_engine": 0.95,
        "concurrent_clients_tokens_per_s": concurrency,
    }
