"""The gateway on the llama.cpp backend against llama-server on the same GGUF, over HTTP.

    python -m benchmarks backends_http   # GGUF=f32,q4_k_m CLIENTS=1,8 ROUNDS=2 (defaults)

The 16 code prompts (benchmarks/prompts), 64 greedy tokens each, sent by 1 and by 8
clients at once (each client takes the next prompt when its answer is back). Sides, per
quantization and number of clients:

- the gateway (`python -m gateway` on a manifest of the demo target and draft v2 as GGUF,
  audit on, GATEWAY_TORCH_THREADS=1, kept prompt prefixes off: every prompt prefilled, as
  llama-server does with `cache_prompt` off) in standard mode, in fixed speculative mode (draft v2,
  k 4) and in auto mode;
- llama-server (benchmarks/_llamacpp.py: one slot per client, one thread, prompt cache
  off, the prompt sent as the gateway's token ids) as users run it, without a draft and
  with draft v2 (`-md`, n_max 8), and once more without a draft but with the kernels the
  backend keeps for exactness (`--no-repack`: no repacked weights; `-ub 63`: a prompt in
  calls of at most 63 tokens; gateway/engine/backends/llamacpp_calls.py). Its prompts take
  the tiled K-quant product as the backend's do; a decode step of 8 tokens or more (8
  clients) takes it too, where the backend's stays on the one-token kernels.

Every side of one quantization and number of clients runs in each round, the order
reversed every other round. Reported per run: tokens/s per round, the mean, and how many
texts equal llama-server's (as users run it, and with the same kernels); per quantization
and clients, the issue's ratios: gateway standard / llama-server, and auto and fixed
speculative / llama-server's better configuration (with or without its draft). Also the
machine: its CPU, its load average before and after, and one thread's memory read rate.
Needs the `llamacpp` extra and a C++ toolchain (llama-server is built once).
"""

from __future__ import annotations

import json
import os
import platform
import queue
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from benchmarks import _llamacpp
from models_registry.gguf import sha256

HERE = Path(__file__).resolve().parent
NEW_TOKENS = 64
K = 4  # the fixed speculative side's k
SAME_KERNELS = ("--no-repack", "-ub", "63")
SERVER = "llama-server"
SERVER_DRAFT = "llama-server, draft v2"
SERVER_SAME = "llama-server, same kernels"
MODES: dict[str, dict[str, Any]] = {
    "gateway standard": {"mode": "standard"},
    "gateway speculative": {"mode": "speculative", "proposer": "draft", "k": K},
    "gateway auto": {"mode": "auto"},
}

Send = Callable[[int], tuple[str, int]]  # prompt index -> (text, completion tokens)


def _texts() -> list[str]:
    out = []
    for name in ("code.jsonl", "heldout.jsonl"):
        lines = (HERE / "prompts" / name).read_text().splitlines()
        out += [json.loads(x)["prompt"] for x in lines if x.strip()]
    return out


def _manifest(kind: str, root: Path) -> Path:
    target, draft = _llamacpp.gguf("target", kind), _llamacpp.gguf("draft_v2", kind)
    entries = [
        {"name": "t", "version": "1", "role": "target", "path": str(target),
         "sha256": sha256(target), "backend": "llama.cpp"},
        {"name": "d", "version": "2", "role": "draft", "target": "t", "path": str(draft),
         "sha256": sha256(draft), "backend": "llama.cpp"},
    ]  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.yaml").write_text(yaml.safe_dump({"models": entries}))
    return root / "manifest.yaml"


def drive(send: Send, n: int, clients: int) -> tuple[float, list[str]]:
    """Prompts 0..n-1 through `clients` concurrent senders (each takes the next prompt when
    its answer is back): (aggregate completion tokens/s, texts in prompt order)."""
    texts: list[str] = [""] * n
    tokens = 0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for i, (text, used) in enumerate(pool.map(send, range(n))):
            texts[i] = text
            tokens += used
    return tokens / (time.perf_counter() - t0), texts


class Pool:
    """HTTP clients made before any timing, one per client at most, each request on one
    taken from the pool: an httpx client costs tens of milliseconds of CPU to make (its TLS
    context), which `httpx.post` pays on every request. No connection is kept alive (a
    fresh one per request, on every side alike: llama-server may close a kept-alive one
    after a response, and the next request on it fails)."""

    def __init__(self, size: int) -> None:
        self._free: queue.SimpleQueue[httpx.Client] = queue.SimpleQueue()
        for _ in range(size):
            limits = httpx.Limits(max_keepalive_connections=0)
            self._free.put(httpx.Client(timeout=600, limits=limits))

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        client = self._free.get()
        try:
            return client.post(url, **kwargs)
        finally:
            self._free.put(client)


def _gateway_send(
    pool: Pool, url: str, key: str, texts: list[str], decoding: dict[str, Any]
) -> Send:
    def send(i: int) -> tuple[str, int]:
        body = {"model": "t", "prompt": texts[i], "max_tokens": NEW_TOKENS, "temperature": 0,
                "decoding": decoding}  # fmt: skip
        r = pool.post(f"{url}/v1/completions", json=body,
                      headers={"authorization": f"Bearer {key}"})  # fmt: skip
        r.raise_for_status()
        j = r.json()
        return j["choices"][0]["text"], int(j["usage"]["completion_tokens"])

    return send


def _server_send(pool: Pool, url: str, prompts: list[list[int]]) -> Send:
    def send(i: int) -> tuple[str, int]:
        body = {"prompt": prompts[i], "n_predict": NEW_TOKENS, "temperature": 0,
                "cache_prompt": False}  # fmt: skip
        r = pool.post(f"{url}/completion", json=body)
        r.raise_for_status()
        j = r.json()
        return j["content"], int(j["tokens_predicted"])

    return send


def _servers(
    stack: ExitStack, pool: Pool, kind: str, clients: int, ids: list[list[int]]
) -> dict[str, Send]:
    """The three llama-servers of one quantization and number of clients, started at once
    (an idle one waits on its socket)."""
    urls = {
        SERVER: stack.enter_context(_llamacpp.server(None, clients, threads=1, kind=kind)),
        SERVER_DRAFT: stack.enter_context(
            _llamacpp.server("draft_v2", clients, threads=1, n_max=8, kind=kind)
        ),
    }
    urls[SERVER_SAME] = stack.enter_context(
        _llamacpp.server(None, clients, threads=1, kind=kind, extra=SAME_KERNELS)
    )
    return {side: _server_send(pool, u, ids) for side, u in urls.items()}


def _cpu() -> str:
    """The CPU's model name (Linux), else the machine's architecture."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    names = [x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")]
    return names[0] if names else platform.machine()


def read_rate() -> float:
    """One thread's memory read rate, GB/s: the best of 5 sums over 256 MiB."""
    a = np.ones(64 << 20, dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from tests.integration.service.process import start_gateway

    texts = _texts()[: 4 if quick else None]
    rounds = 1 if quick else int(os.environ.get("ROUNDS", "2"))
    clients_all = [int(c) for c in os.environ.get("CLIENTS", "1,8").split(",")]
    _llamacpp.server_binary()
    pool = Pool(max(clients_all))
    report: dict[str, Any] = {
        "new_tokens": NEW_TOKENS, "prompts": len(texts), "rounds": rounds, "k": K,
        "cpu": _cpu(), "cores": os.cpu_count(),
        "load_before": os.getloadavg(), "read_gb_per_s_one_thread": read_rate(),
        "runs": {}, "ratios": {},
    }  # fmt: skip
    for kind in os.environ.get("GGUF", "f32,q4_k_m").split(","):
        root = _llamacpp.HOME / "backends_http" / kind
        manifest = _manifest(kind, root)
        tok = AutoTokenizer.from_pretrained(
            str(_llamacpp.gguf("target", kind).parent), local_files_only=True
        )
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in texts]
        (root / "var").mkdir(exist_ok=True)
        proc, url, key = start_gateway(
            manifest, root / "var", torch_threads="1", default_requests_per_minute="100000",
            prefix_cache="false",
        )  # fmt: skip
        try:
            gateway = {s: _gateway_send(pool, url, key, texts, d) for s, d in MODES.items()}
            for clients in clients_all:
                with ExitStack() as stack:
                    sends = {**_servers(stack, pool, kind, clients, ids), **gateway}
                    _measure(report, f"{kind}/{clients}", sends, len(texts), clients, rounds)
        finally:
            proc.terminate()
            proc.wait(60)
    report["load_after"] = os.getloadavg()
    return report


def _measure(
    report: dict[str, Any], name: str, sends: dict[str, Send], n: int, clients: int, rounds: int
) -> None:
    for send in sends.values():  # warm-up: one prompt each
        drive(send, 1, 1)
    tps: dict[str, list[float]] = {}
    outs: dict[str, list[str]] = {}
    order = list(sends)
    for r in range(rounds):
        for side in order if r % 2 == 0 else order[::-1]:
            t, o = drive(sends[side], n, clients)
            tps.setdefault(side, []).append(t)
            outs[side] = o
    peer, same = outs[SERVER], outs[SERVER_SAME]
    for side, values in tps.items():
        run_ = report["runs"][f"{name}/{side}"] = {
            "tokens_per_s": values,
            "mean": statistics.mean(values),
            "equal_to_llama_server": sum(a == b for a, b in zip(outs[side], peer, strict=True)),
            "equal_to_same_kernels": sum(a == b for a, b in zip(outs[side], same, strict=True)),
        }
        print(f"   {name}/{side}: {run_}", flush=True)
    mean = {side: statistics.mean(v) for side, v in tps.items()}
    better = max(mean[SERVER], mean[SERVER_DRAFT])
    report["ratios"][name] = {
        "standard / llama-server": mean["gateway standard"] / mean[SERVER],
        "standard / llama-server, same kernels": mean["gateway standard"] / mean[SERVER_SAME],
        "auto / llama-server's better": mean["gateway auto"] / better,
        "speculative / llama-server's better": mean["gateway speculative"] / better,
    }


def table(result: dict[str, Any]) -> str:
    n = result["prompts"]
    lines = [f"{'quantization/clients/side':42} {'tokens/s (rounds)':>20} {'mean':>6} "
             f"{'= server':>9} {'= same':>7}"]  # fmt: skip
    for name, r in result["runs"].items():
        rates = " ".join(f"{x:.0f}" for x in r["tokens_per_s"])
        eq, same = r["equal_to_llama_server"], r["equal_to_same_kernels"]
        lines.append(f"{name:42} {rates:>20} {r['mean']:6.0f} {eq:>6}/{n} {same:>4}/{n}")
    for name, ratios in result["ratios"].items():
        lines.append(f"{name}: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    return "\n".join(lines)
