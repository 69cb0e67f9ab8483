"""Concurrent clients over HTTP: aggregate tokens/s, time to first token and inter-token
latency (p50, p95), for forced standard, forced speculative (draft v2) and auto, at 1, 2,
4, 8 and 16 clients; next to Hugging Face `generate` on a static padded batch of the same
prompts and transformers' own continuous batching (`generate_batch`, paged attention), both
in-process in a process of their own (same models, greedy, same new tokens). Every output
is compared with the same prompt served alone (standard decoding, one client): the report
gives the share that is identical. Writes concurrency.json and concurrency.png.

    python -m benchmarks concurrency [--quick]

Each client streams its requests one after another (the prompts dealt round-robin); a
real gateway process serves them (uvicorn, SQLite audit, the demo target with draft v2 as
its only draft), with GATEWAY_MAX_BATCH=16. The gateway and the HF baseline never run at
the same time. The gateway inherits this process's environment: `GATEWAY_COMPILE=auto
python -m benchmarks concurrency` measures the compiled step (setup.compile says which).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks._server import Running, gateway
from benchmarks.http import MODEL, _manifest

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = Path(__file__).resolve().parent / "prompts" / "heldout.jsonl"
NEW_TOKENS = 64
CLIENTS = (1, 2, 4, 8, 16)
MIN_REQUESTS = 8  # requests per mode, concurrency and round at least
ROUNDS = 2  # rounds per concurrency, the modes' order reversed in the second
MODES: dict[str, dict[str, Any]] = {
    "standard": {"mode": "standard"},
    "speculative": {"mode": "speculative", "proposer": "draft"},
    "auto": {"mode": "auto"},
}


def _prompts() -> list[str]:
    return [json.loads(x)["prompt"] for x in PROMPTS.read_text().splitlines() if x.strip()]


def _stream(
    client: httpx.Client, key: str, prompt: str, decoding: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One streamed completion: tokens, time to first token, gaps between chunks. `extra`:
    more body fields (a peer server's own options)."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "decoding": decoding,
        **(extra or {}),
    }
    t0 = time.perf_counter()
    stamps: list[float] = []
    texts: list[str] = []
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
                texts.append(chunk["choices"][0]["text"])
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "prompt": prompt,
        "text": "".join(texts),
        "tokens": tokens,
        "ttft": stamps[0] - t0 if stamps else None,
        "gaps": gaps,
        "mode": r.headers.get("x-decoding-mode"),
    }


@dataclass(frozen=True, kw_only=True)
class Clients:
    """`count` clients streaming `per_client` requests each to `url` with `key`, the prompts
    dealt from `offset`; `keepalive`: reuse each client's connection; `extra`: more body
    fields (a peer server's own options)."""

    url: str
    key: str
    count: int
    per_client: int
    decoding: dict[str, Any]
    keepalive: bool = True
    offset: int = 0
    extra: dict[str, Any] | None = None


def _level(clients: Clients, prompts: list[str], alone: dict[str, str]) -> dict[str, Any]:
    return _summary([_runs(clients, prompts)], alone)


def _runs(clients: Clients, prompts: list[str]) -> tuple[list[dict[str, Any]], float]:
    """Every request's record and the wall seconds of the whole."""
    work = [
        [
            prompts[(clients.offset + i * clients.per_client + j) % len(prompts)]
            for j in range(clients.per_client)
        ]
        for i in range(clients.count)
    ]

    def client_run(mine: list[str]) -> list[dict[str, Any]]:
        limits = httpx.Limits(max_keepalive_connections=None if clients.keepalive else 0)
        with httpx.Client(base_url=clients.url, timeout=600, limits=limits) as client:
            return [_stream(client, clients.key, p, clients.decoding, clients.extra) for p in mine]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients.count) as pool:
        runs = [r for rs in pool.map(client_run, work) for r in rs]
    return runs, time.perf_counter() - t0


def _summary(
    rounds: list[tuple[list[dict[str, Any]], float]], alone: dict[str, str]
) -> dict[str, Any]:
    """Pooled over rounds: tokens / wall, and percentiles over every request's gaps."""
    runs = [r for rs, _ in rounds for r in rs]
    wall = sum(w for _, w in rounds)
    ttft = [r["ttft"] for r in runs if r["ttft"] is not None]
    gaps = [g for r in runs for g in r["gaps"]]
    modes = [r["mode"] for r in runs]
    return {
        "tokens_per_s": round(sum(r["tokens"] for r in runs) / wall, 1),
        "ttft_ms": {"p50": _pct(ttft, 50), "p95": _pct(ttft, 95)},
        "itl_ms": {"p50": _pct(gaps, 50), "p95": _pct(gaps, 95)},
        "speculative_share": round(modes.count("speculative") / len(modes), 3),
        "identical_to_alone": round(
            sum(r["text"] == alone[r["prompt"]] for r in runs) / len(runs), 3
        ),
        "requests": len(runs),
        "rounds": len(rounds),
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


def _hf_continuous(prompts: list[str], n: int) -> dict[str, Any]:
    """transformers' continuous batching (generate_batch, paged attention), own process."""
    code = f"""
import json, logging, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
logging.disable(logging.WARNING)
path = {str(ROOT / "models_registry/demo/demo-code-target-v1")!r}
tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32,
                                             attn_implementation="paged|sdpa")
prompts = {prompts!r}
work = [tok(prompts[i % len(prompts)])["input_ids"] for i in range({n})]
cfg = GenerationConfig(max_new_tokens={NEW_TOKENS}, do_sample=False,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
def run():
    out = model.generate_batch(work, generation_config=cfg)
    return sum(len(o.generated_tokens) for o in out.values())
run()
t0 = time.perf_counter(); n = run(); dt = time.perf_counter() - t0
print(json.dumps({{"tokens_per_s": round(n / dt, 1), "requests": {n}}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _forward_costs() -> dict[str, Any]:
    """What the engine's probe measures for the demo pair in a process of its own (the
    gateway is down): target forward ms by rows x tokens, and the draft's per row count."""
    code = """
import json
from benchmarks._pairs import load_pair
from gateway.engine import Engine, init_torch_thread
init_torch_thread()
pair = load_pair()
eng = Engine(pair.target)
t = eng.measure_costs(16)
d = eng.measure_costs(16, pair.drafts["v2"])
fmt = lambda c: {f"{r}x{k}": round(1000 * s, 2) for (r, k), s in sorted(c.means.items())}
print(json.dumps({"target": fmt(t), "draft_v2": fmt(d)}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _alone(url: str, key: str, prompts: list[str]) -> dict[str, str]:
    """Each prompt served alone, standard decoding: the reference text."""
    with httpx.Client(base_url=url, timeout=600) as c:
        return {p: _stream(c, key, p, MODES["standard"])["text"] for p in prompts}


@contextmanager
def warm_gateway(
    prompts: list[str], module: str = "gateway", cwd: Path | None = None, **env: str
) -> Iterator[tuple[Running, str]]:
    """A gateway on the demo pair (draft v2; 16 batch rows unless `env` says otherwise), a
    tenant allowed to pick its decoding, warmed up in every mode (the draft loads on first
    use); yields the running gateway and the tenant's key."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = {
            "GATEWAY_MAX_BATCH": "16",
            "GATEWAY_MAX_ACTIVE": "32",
            "GATEWAY_QUEUE_CAPACITY": "64",
            "GATEWAY_MODELS": str(_manifest(Path(tmp))),
            **env,
        }
        with gateway(module=module, cwd=cwd, **settings) as gw:
            key = gw.tenant("bench", {"client_override": {"allow": True}})
            with httpx.Client(base_url=gw.url, timeout=600) as c:
                for d in MODES.values():
                    _stream(c, key, prompts[0], d)
            yield gw, key


@contextmanager
def batch_gateway(prompts: list[str], **env: str) -> Iterator[tuple[str, str, dict[str, str]]]:
    """`warm_gateway`; yields its URL, the tenant's key and each prompt's standard text
    served alone (the reference for `identical_to_alone`)."""
    with warm_gateway(prompts, **env) as (gw, key):
        yield gw.url, key, _alone(gw.url, key, prompts)


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    prompts = _prompts()
    clients = (1, 8) if quick else CLIENTS
    results: dict[str, dict[str, Any]] = {m: {} for m in MODES}
    with batch_gateway(prompts) as (url, key, alone):
        for n in clients:
            # At least MIN_REQUESTS requests a round (8 for 1 client: two requests gave
            # ratios that moved 25% between runs), two rounds in opposite mode order.
            per_client = 1 if quick else max(2, MIN_REQUESTS // n)
            pooled: dict[str, list[tuple[list[dict[str, Any]], float]]] = {m: [] for m in MODES}
            for rnd in range(1 if quick else ROUNDS):
                order = list(MODES) if rnd % 2 == 0 else list(reversed(MODES))
                for name in order:
                    clients_n = Clients(
                        url=url,
                        key=key,
                        count=n,
                        per_client=per_client,
                        decoding=MODES[name],
                        offset=rnd,
                    )
                    pooled[name].append(_runs(clients_n, prompts))
            for name in MODES:
                results[name][str(n)] = level = _summary(pooled[name], alone)
                print(f"   {name:11} {n:2} clients: {level}", flush=True)
    sizes = (1, 8) if quick else (1, 8, 16)
    costs = _forward_costs()
    hf = {str(b): _hf_static(prompts, b) for b in sizes}
    hf_cb = {str(b): _hf_continuous(prompts, b) for b in sizes}
    print(f"   HF static {hf}, HF continuous {hf_cb}", flush=True)
    top = str(max(clients))
    eight = "8"
    auto = results["auto"]
    _plot(out_dir / "concurrency.png", results, hf, hf_cb)
    return {
        "setup": {
            "prompts": len(prompts),
            "new_tokens": NEW_TOKENS,
            "greedy": True,
            "requests_per_mode_and_round": {
                str(n): n * (1 if quick else max(2, MIN_REQUESTS // n)) for n in clients
            },
            "rounds": 1 if quick else ROUNDS,
            "draft": "demo-code-draft@2",
            "max_batch": 16,
            "compile": os.environ.get("GATEWAY_COMPILE", "off"),  # the gateway inherits it
        },
        "gateway": results,
        "hf_static_batch": hf,
        "hf_continuous_batching": hf_cb,
        "forward_costs_ms": costs,
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
                auto[eight]["tokens_per_s"] / hf["8"]["tokens_per_s"], 3
            ),
            "ours_8_over_hf_continuous_8": round(
                auto[eight]["tokens_per_s"] / hf_cb["8"]["tokens_per_s"], 3
            ),
            "auto_8_over_standard_8": round(
                auto[eight]["tokens_per_s"] / results["standard"][eight]["tokens_per_s"], 3
            ),
            "identical_to_alone": min(
                lv["identical_to_alone"] for r in results.values() for lv in r.values()
            ),
            "top_clients": top,
        },
    }


def _best(results: dict[str, dict[str, Any]], n: str) -> float:
    return max(results[m][n]["tokens_per_s"] for m in ("standard", "speculative"))


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _plot(
    path: Path, results: dict[str, dict[str, Any]], hf: dict[str, Any], hf_cb: dict[str, Any]
) -> None:
    """Aggregate tokens/s and p95 inter-token latency against clients."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tps, itl) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, levels in results.items():
        xs = [int(n) for n in levels]
        tps.plot(xs, [v["tokens_per_s"] for v in levels.values()], marker="o", label=name)
        itl.plot(xs, [v["itl_ms"]["p95"] for v in levels.values()], marker="o", label=name)
    for label, base, style in (("HF static batch", hf, "k--"), ("HF generate_batch", hf_cb, "k:")):
        xs = [int(n) for n in base]
        tps.plot(xs, [v["tokens_per_s"] for v in base.values()], style, marker="s", label=label)
    tps.set(xlabel="concurrent clients (batch for HF)", ylabel="aggregate tokens/s",
            xscale="log", title="Throughput, greedy, 64 new tokens")  # fmt: skip
    itl.set(xlabel="concurrent clients", ylabel="p95 inter-token latency (ms)", xscale="log",
            title="Inter-token latency (streamed)")  # fmt: skip
    for ax in (tps, itl):
        ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
