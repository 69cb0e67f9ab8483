"""Concurrent clients over HTTP: aggregate tokens/s, time to first token and inter-token
latency (p50, p95), for forced standard, forced speculative (draft v2) and auto, at 1, 2,
4, 8 and 16 clients; next to Hugging Face `generate` on a static padded batch of the same
prompts (same models, greedy, same new tokens) in a process of its own.

    python -m benchmarks concurrency [--quick]

Each client streams its requests one after another (the prompts dealt round-robin); a
real gateway process serves them (uvicorn, SQLite audit, the demo target with draft v2 as
its only draft), with GATEWAY_MAX_BATCH=16. The gateway and the HF baseline never run at
the same time.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from benchmarks._server import gateway
from benchmarks.http import MODEL, _manifest

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = Path(__file__).resolve().parent / "prompts" / "heldout.jsonl"
NEW_TOKENS = 64
CLIENTS = (1, 2, 4, 8, 16)
MODES: dict[str, dict[str, Any]] = {
    "standard": {"mode": "standard"},
    "speculative": {"mode": "speculative", "proposer": "draft"},
    "auto": {"mode": "auto"},
}


def _prompts() -> list[str]:
    return [json.loads(x)["prompt"] for x in PROMPTS.read_text().splitlines() if x.strip()]


def _stream(
    client: httpx.Client, key: str, prompt: str, decoding: dict[str, Any]
) -> dict[str, Any]:
    """One streamed completion: tokens, time to first token, gaps between chunks."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "decoding": decoding,
    }
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    headers = {"authorization": f"Bearer {key}"}
    with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            elif chunk.get("choices") and chunk["choices"][0].get("text"):
                stamps.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "tokens": tokens,
        "ttft": stamps[0] - t0 if stamps else None,
        "gaps": gaps,
        "mode": r.headers.get("x-decoding-mode"),
    }


def _level(
    url: str, key: str, prompts: list[str], clients: int, per_client: int, decoding: dict[str, Any]
) -> dict[str, Any]:
    work = [
        [prompts[(c * per_client + i) % len(prompts)] for i in range(per_client)]
        for c in range(clients)
    ]

    def client_run(mine: list[str]) -> list[dict[str, Any]]:
        with httpx.Client(base_url=url, timeout=600) as client:
            return [_stream(client, key, p, decoding) for p in mine]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        runs = [r for rs in pool.map(client_run, work) for r in rs]
    wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in runs if r["ttft"] is not None]
    gaps = [g for r in runs for g in r["gaps"]]
    modes = [r["mode"] for r in runs]
    return {
        "tokens_per_s": round(sum(r["tokens"] for r in runs) / wall, 1),
        "ttft_ms": {"p50": _pct(ttft, 50), "p95": _pct(ttft, 95)},
        "itl_ms": {"p50": _pct(gaps, 50), "p95": _pct(gaps, 95)},
        "speculative_share": round(modes.count("speculative") / len(modes), 3),
        "requests": len(runs),
    }


def _pct(xs: list[float], q: int) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(1000 * xs[min(len(xs) - 1, int(len(xs) * q / 100))], 2)


def _hf_static(prompts: list[str], batch: int) -> dict[str, Any]:
    """HF generate on a left-padded batch, in its own process (the gateway is down)."""
    code = f"""
import json, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path = {str(ROOT / "models_registry/demo/demo-code-target-v1")!r}
tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
tok.padding_side = "left"
tok.pad_token = tok.pad_token or tok.eos_token
model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
prompts = {prompts!r}
work = [prompts[i % len(prompts)] for i in range({batch})]
def run():
    x = tok(work, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = model.generate(**x, max_new_tokens={NEW_TOKENS}, min_new_tokens={NEW_TOKENS},
                             do_sample=False, pad_token_id=tok.pad_token_id)
    return (out.shape[1] - x["input_ids"].shape[1]) * len(work)
run()
t0 = time.perf_counter(); n = run(); dt = time.perf_counter() - t0
print(json.dumps({{"tokens_per_s": round(n / dt, 1), "batch": {batch}}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    prompts = _prompts()
    per_client = 1 if quick else 2
    clients = (1, 8) if quick else CLIENTS
    results: dict[str, dict[str, Any]] = {m: {} for m in MODES}
    with (
        tempfile.TemporaryDirectory() as tmp,
        gateway(
            GATEWAY_MAX_BATCH="16",
            GATEWAY_MAX_ACTIVE="32",
            GATEWAY_QUEUE_CAPACITY="64",
            GATEWAY_MODELS=str(_manifest(Path(tmp))),
        ) as gw,
    ):
        key = gw.tenant("bench", {"client_override": {"allow": True}})
        with httpx.Client(base_url=gw.url, timeout=600) as c:
            for d in MODES.values():
                _stream(c, key, prompts[0], d)  # warm-up (the draft loads on first use)
        for n in clients:
            for name, decoding in MODES.items():
                results[name][str(n)] = _level(gw.url, key, prompts, n, per_client, decoding)
                print(f"   {name:11} {n:2} clients: {results[name][str(n)]}", flush=True)
    hf = {str(b): _hf_static(prompts, b) for b in ((1, 8) if quick else (1, 8, 16))}
    top = str(max(clients))
    eight = "8"
    auto = results["auto"]
    return {
        "setup": {
            "prompts": len(prompts),
            "new_tokens": NEW_TOKENS,
            "greedy": True,
            "requests_per_client": per_client,
            "draft": "demo-code-draft@2",
            "max_batch": 16,
        },
        "gateway": results,
        "hf_static_batch": hf,
        "goals": {
            "auto_8_over_1": round(auto[eight]["tokens_per_s"] / auto["1"]["tokens_per_s"], 3),
            "auto_over_best_fixed": {
                n: round(
                    auto[n]["tokens_per_s"]
                    / max(
                        results["standard"][n]["tokens_per_s"],
                        results["speculative"][n]["tokens_per_s"],
                    ),
                    3,
                )
                for n in auto
            },
            "p95_itl_8_over_1": _ratio(auto[eight]["itl_ms"]["p95"], auto["1"]["itl_ms"]["p95"]),
            "ours_8_over_hf_static_8": round(
                max(r[eight]["tokens_per_s"] for r in results.values()) / hf["8"]["tokens_per_s"], 3
            ),
            "top_clients": top,
        },
    }


def _best(results: dict[str, dict[str, Any]], n: str) -> float:
    return max(results[m][n]["tokens_per_s"] for m in ("standard", "speculative"))


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None
