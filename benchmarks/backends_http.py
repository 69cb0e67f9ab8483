"""The gateway on the llama.cpp backend against llama-server on the same GGUF, over HTTP.

    python -m benchmarks backends_http          # GGUF=f32,q4_k_m (default) ROUNDS=2

One client, the 16 code prompts (benchmarks/prompts), 64 greedy tokens each, no draft on
llama-server's side: the gateway (`python -m gateway` on a manifest of the demo target and
draft v2 as GGUF, audit on, GATEWAY_TORCH_THREADS=1) in standard and auto mode, and
llama-server (benchmarks/_llamacpp.py, one slot, one thread, prompt cache off, the prompt
sent as the gateway's token ids) twice: as users run it, and with the kernels the backend
keeps for exactness (`--no-repack`, `-ub 63`, GGML_CPU_TILED_MM=0;
gateway/engine/backends/llamacpp.py). Rounds alternate the sides' order. Reported per
quantization and side: tokens/s per round (the gateway's rounds beside each llama-server),
and how many texts equal each llama-server's. Needs the `llamacpp` extra and a C++
toolchain (llama-server is built once).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks import _llamacpp
from models_registry.gguf import sha256

HERE = Path(__file__).resolve().parent
NEW_TOKENS = 64
SAME_KERNELS = ("--no-repack", "-ub", "63")


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


def _gateway(url: str, key: str, texts: list[str], mode: str) -> tuple[float, list[str]]:
    out, tokens, t0 = [], 0, time.perf_counter()
    with httpx.Client(timeout=600, headers={"authorization": f"Bearer {key}"}) as c:
        for p in texts:
            body = {"model": "t", "prompt": p, "max_tokens": NEW_TOKENS, "temperature": 0,
                    "decoding": {"mode": mode}}  # fmt: skip
            j = c.post(f"{url}/v1/completions", json=body).json()
            out.append(j["choices"][0]["text"])
            tokens += j["usage"]["completion_tokens"]
    return tokens / (time.perf_counter() - t0), out


def _server(url: str, prompts: list[list[int]]) -> tuple[float, list[str]]:
    out, tokens, t0 = [], 0, time.perf_counter()
    for ids in prompts:
        # a fresh connection per request: llama-server may close a kept-alive one
        with httpx.Client(timeout=600) as c:
            body = {"prompt": ids, "n_predict": NEW_TOKENS, "temperature": 0,
                    "cache_prompt": False}  # fmt: skip
            j = c.post(f"{url}/completion", json=body).json()
        out.append(j["content"])
        tokens += j["tokens_predicted"]
    return tokens / (time.perf_counter() - t0), out


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from tests.integration.service.process import start_gateway

    texts = _texts()[: 4 if quick else None]
    rounds = 1 if quick else int(os.environ.get("ROUNDS", "2"))
    _llamacpp.server_binary()
    report: dict[str, Any] = {"new_tokens": NEW_TOKENS, "prompts": len(texts), "runs": {}}
    for kind in os.environ.get("GGUF", "f32,q4_k_m").split(","):
        root = _llamacpp.HOME / "backends_http" / kind
        manifest = _manifest(kind, root)
        tok = AutoTokenizer.from_pretrained(
            str(_llamacpp.gguf("target", kind).parent), local_files_only=True
        )
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in texts]
        tps: dict[str, list[float]] = {}
        outs: dict[str, list[str]] = {}
        (root / "var").mkdir(exist_ok=True)
        proc, url, key = start_gateway(manifest, root / "var", torch_threads="1")
        try:
            for side, extra in (("llama-server", ()), ("llama-server, same kernels", SAME_KERNELS)):
                env = os.environ.get("GGML_CPU_TILED_MM")
                if extra:
                    os.environ["GGML_CPU_TILED_MM"] = "0"  # llama-server inherits it
                with _llamacpp.server(None, slots=1, threads=1, kind=kind, extra=extra) as lurl:
                    _server(lurl, ids[:1]), _gateway(url, key, texts[:1], "standard")  # warm-up
                    for r in range(rounds):
                        sides = [side, "gateway standard", "gateway auto"]
                        for s in sides if r % 2 == 0 else sides[::-1]:
                            if s == side:
                                t, o = _server(lurl, ids)
                            else:
                                t, o = _gateway(url, key, texts, s.split()[-1])
                            tps.setdefault(s, []).append(t)
                            outs[s] = o
                if env is None:
                    os.environ.pop("GGML_CPU_TILED_MM", None)
        finally:
            proc.terminate()
            proc.wait(60)
        peer, same = outs["llama-server"], outs["llama-server, same kernels"]
        for s, values in tps.items():
            equal = sum(a == b for a, b in zip(outs[s], peer, strict=True))
            equal_same = sum(a == b for a, b in zip(outs[s], same, strict=True))
            report["runs"][f"{kind}/{s}"] = {
                "tokens_per_s": values, "equal_to_llama_server": equal,
                "equal_to_same_kernels": equal_same,
            }  # fmt: skip
            print(f"   {kind}/{s}: {values} tokens/s, {equal}/{len(peer)} equal", flush=True)
    return report


def table(result: dict[str, Any]) -> str:
    n = result["prompts"]
    lines = [f"{'quantization/side':36} {'tokens/s (rounds)':>28} {'= server':>9} {'= same':>7}"]
    for name, r in result["runs"].items():
        rates = " ".join(f"{x:.0f}" for x in r["tokens_per_s"])
        eq, same = r["equal_to_llama_server"], r["equal_to_same_kernels"]
        lines.append(f"{name:36} {rates:>28} {eq:>6}/{n} {same:>4}/{n}")
    return "\n".join(lines)
