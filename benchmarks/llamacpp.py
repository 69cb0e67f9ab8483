"""The gateway against llama.cpp's llama-server, side by side over HTTP, in one run.

    python -m benchmarks llamacpp [--quick]

Same demo pair (llama.cpp gets f32 GGUFs converted from the same weights), same held-out
code prompts, greedy, 64 new tokens, streamed /v1/completions through the same client code
(benchmarks/concurrency.py), at 1 and 8 concurrent clients. Gateway: standard, speculative
(draft v2) and auto, drafting 1 to 8 tokens a step (the default policy's bounds; the cost
model picks k each step). llama-server: no draft, and draft v2 with at most 8 drafted
tokens (the same bound; it stops a draft early by its own rule), 8 slots, 2 threads (this
machine's cores). The gateway runs twice: eager (the default) and with
GATEWAY_COMPILE=auto (engine/compiled.py: compiled where it measured faster; its inductor
cache is shared by the rounds, so only the first warm-up compiles). Each level runs at
least concurrency.MIN_REQUESTS requests (8 at 1 client). No two servers run at once;
rounds alternate the order, and the report gives medians over three rounds (one round of
a level now and then runs several times slower than the others, a stall not reproduced
alone) and every round's tokens/s (`rounds_tokens_per_s`).
`equal_to_gateway_eager_alone` is the smallest share, over llama-server's and the compiled
gateway's levels, of texts equal to the eager gateway's standard output served alone.

llama.cpp is built here on first use (benchmarks/_llamacpp.py: PyPI sdist, cmake; several
minutes), under var/llamacpp/. It is an optional extra: `make test` never runs this.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks import _llamacpp
from benchmarks.concurrency import MIN_REQUESTS, MODES, _level, _prompts, _stream, batch_gateway

CLIENTS = (1, 8)
COMPILE_CACHE = _llamacpp.ROOT / "var" / "bench-compile-cache"  # shared by the rounds
PEER_MODES: dict[str, str | None] = {"standard": None, "speculative": "draft_v2"}


def _gateway_side(
    prompts: list[str], per_client: Callable[[int], int], compiled: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    out: dict[str, Any] = {}
    with batch_gateway(
        prompts,
        GATEWAY_COMPILE="auto" if compiled else "off",
        TORCHINDUCTOR_CACHE_DIR=str(COMPILE_CACHE),
    ) as (url, key, alone):
        for mode, decoding in MODES.items():
            for n in CLIENTS:
                out[f"{mode}_{n}"] = _level(url, key, prompts, n, per_client(n), decoding, alone)
    return out, alone


def _peer_side(
    prompts: list[str], per_client: Callable[[int], int], alone: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, draft in PEER_MODES.items():
        with _llamacpp.server(draft, slots=max(CLIENTS)) as url:
            with httpx.Client(base_url=url, timeout=600) as c:
                _stream(c, "none", prompts[0], {})  # warm-up
            for n in CLIENTS:
                # a fresh connection per request: llama-server may close a kept-alive one
                # after a stream, and the next request on it fails
                out[f"{mode}_{n}"] = _level(
                    url, "none", prompts, n, per_client(n), {}, alone, keepalive=False
                )
    return out


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key]["tokens_per_s"] for r in rounds), 1)


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    prompts = _prompts()

    def per_client(n: int) -> int:
        return 1 if quick else max(2, MIN_REQUESTS // n)

    rounds = 1 if quick else 3  # a median of three: one stalled round decides nothing
    _llamacpp.server_binary(), _llamacpp.gguf("target"), _llamacpp.gguf("draft_v2")  # build first
    sides: dict[str, list[dict[str, Any]]] = {"eager": [], "compiled": [], "peer": []}
    alone: dict[str, str] = {}  # the gateway's texts alone: the first round runs it first
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            if side == "peer":
                sides[side].append(_peer_side(prompts, per_client, alone))
            else:
                got, alone = _gateway_side(prompts, per_client, compiled=side == "compiled")
                sides[side].append(got)
            print(f"   round {r + 1}: {side} {_brief(sides[side][-1])}", flush=True)
    ours, compiled, peer = sides["eager"], sides["compiled"], sides["peer"]
    equal = [lv["identical_to_alone"] for p in peer + compiled for lv in p.values()]
    keys = [f"{m}_{n}" for m in MODES for n in CLIENTS]
    gw = {k: _median(ours, k) for k in keys}
    gc = {k: _median(compiled, k) for k in keys}
    lc = {k: _median(peer, k) for k in (f"{m}_{n}" for m in PEER_MODES for n in CLIENTS)}
    return {
        "setup": {
            "prompts": len(prompts),
            "new_tokens": 64,
            "greedy": True,
            "clients": CLIENTS,
            "requests_per_client": {str(n): per_client(n) for n in CLIENTS},
            "compiled": "GATEWAY_COMPILE=auto",
            "rounds": rounds,
            "draft": "demo-code-draft@2",
            "peer": "llama-server (llama.cpp from llama-cpp-python's sdist, GGML_NATIVE), f32 "
            "GGUF, -np 8 -t 2, draft max 8",
        },
        "gateway_tokens_per_s": gw,
        "gateway_compiled_tokens_per_s": gc,
        "llama_server_tokens_per_s": lc,
        "rounds_tokens_per_s": {side: [_brief(r) for r in got] for side, got in sides.items()},
        "gateway_itl_ms": {k: ours[-1][k]["itl_ms"] for k in keys},
        "gateway_compiled_itl_ms": {k: compiled[-1][k]["itl_ms"] for k in keys},
        "llama_server_itl_ms": {k: peer[-1][k]["itl_ms"] for k in lc},
        "equal_to_gateway_eager_alone": min(equal) if equal else None,
        "compiled_ratios": {
            "standard_1_over_peer": round(gc["standard_1"] / lc["standard_1"], 3),
            "speculative_1_over_peer": round(gc["speculative_1"] / lc["speculative_1"], 3),
            "auto_8_over_peer_best_8": round(
                gc["auto_8"] / max(lc["standard_8"], lc["speculative_8"]), 3
            ),
            "over_eager": {k: round(gc[k] / gw[k], 3) for k in keys},
        },
        "ratios": {
            "standard_1": round(gw["standard_1"] / lc["standard_1"], 3),
            "speculative_1": round(gw["speculative_1"] / lc["speculative_1"], 3),
            "auto_1_over_peer_best_1": round(
                gw["auto_1"] / max(lc["standard_1"], lc["speculative_1"]), 3
            ),
            "auto_8_over_peer_best_8": round(
                gw["auto_8"] / max(lc["standard_8"], lc["speculative_8"]), 3
            ),
            "gateway_auto_8_over_1": round(gw["auto_8"] / gw["auto_1"], 3),
            "peer_standard_8_over_1": round(lc["standard_8"] / lc["standard_1"], 3),
            "peer_speculative_8_over_standard_8": round(lc["speculative_8"] / lc["standard_8"], 3),
            "gateway_auto_8_over_standard_8": round(gw["auto_8"] / gw["standard_8"], 3),
        },
    }


def _brief(levels: dict[str, Any]) -> dict[str, float]:
    return {k: v["tokens_per_s"] for k, v in levels.items()}
