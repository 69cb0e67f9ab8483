"""The gateway against llama.cpp's llama-server, side by side over HTTP, in one run.

    python -m benchmarks llamacpp [--quick]

Same demo pair (llama.cpp gets f32 GGUFs converted from the same weights), same held-out
code prompts, greedy, 64 new tokens, streamed /v1/completions through the same client code
(benchmarks/concurrency.py), at 1 and 8 concurrent clients. Gateway: standard, speculative
(draft v2) and auto, drafting 1 to 8 tokens a step (the default policy's bounds; the cost
model picks k each step). llama-server: no draft, and draft v2 with at most 8 drafted
tokens (the same bound; it stops a draft early by its own rule), 8 slots, 2 threads (this
machine's cores). The gateway runs three times: eager (the default) and with
GATEWAY_COMPILE=auto (speed/compiled.py: compiled where it measured faster), both without
kept prompt prefixes, and compiled with them (GATEWAY_PREFIX_CACHE=true).

Paired, interleaved: the five servers (three gateways, two llama-servers) start one after
the other and then stay up, idle but for the one being measured (they never run requests
at once). Each level (mode x clients) runs on every server back to back, the order
alternating by round, so the servers of one level are measured within seconds of each
other. On the 2-core machines this project runs on, throughput drifts by up to 2x within
minutes (neighbours on the host); a run that measured each server over minutes of its own
could not tell the servers apart from the drift. The goals' ratios are the median over
rounds of each round's ratio (`compiled_ratios`); tokens/s are medians over rounds, and
every round's are in `rounds_tokens_per_s`.

llama-server keeps each slot's prompt and, by default (`cache_prompt`), serves a prompt it
has seen from that cache instead of prefilling it. The benchmark repeats its 8 prompts
across levels and rounds, so with that default llama-server would prefill almost nothing
while the gateway without kept prefixes prefills every prompt (earlier runs measured
that). The same-work comparison (the goals' ratios) therefore sends
`cache_prompt: false` to llama-server and runs the gateways without kept prefixes; the
same llama-servers are also measured with their default, prompts seen before
(`llama_server_prompt_cache_*`), against the compiled gateway keeping prefixes
(`prompt_cache_ratios`).
`equal_to_gateway_eager_alone` is the smallest share, over llama-server's and the compiled
gateway's levels, of texts equal to the eager gateway's standard output served alone.

llama.cpp is built here on first use (benchmarks/_llamacpp.py: PyPI sdist, cmake; several
minutes), under var/llamacpp/. It is an optional extra: `make test` never runs this.
"""

from __future__ import annotations

import itertools
import statistics
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks import _llamacpp
from benchmarks.concurrency import (
    MIN_REQUESTS,
    MODES,
    Clients,
    _level,
    _prompts,
    _stream,
    batch_gateway,
)

CLIENTS = (1, 8)
COMPILE_CACHE = _llamacpp.ROOT / "var" / "bench-compile-cache"  # shared by the runs
PEER_MODES: dict[str, str | None] = {"standard": None, "speculative": "draft_v2"}
PEER_CACHE: dict[str, dict[str, Any]] = {  # side: llama-server's body options
    "peer": {"cache_prompt": False},  # same work as the gateway: every prompt prefilled
    "peer_prompt_cache": {},  # its default: a prompt seen before comes from a slot's cache
}
GOALS = {  # issue 20's throughput goals: compiled gateway level / llama-server level(s)
    "standard_1_over_peer": ("standard_1", ("standard_1",)),
    "speculative_1_over_peer": ("speculative_1", ("speculative_1",)),
    "auto_8_over_peer_best_8": ("auto_8", ("standard_8", "speculative_8")),
}


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    prompts = _prompts()

    def per_client(n: int) -> int:
        return 1 if quick else max(2, MIN_REQUESTS // n)

    rounds = 1 if quick else 5  # a median of five: one or two stalled rounds decide nothing
    _llamacpp.server_binary(), _llamacpp.gguf("target"), _llamacpp.gguf("draft_v2")  # build first
    sides = ("eager", "compiled", "compiled_prefix_cache", "peer", "peer_prompt_cache")
    compiled = {"GATEWAY_COMPILE": "auto", "TORCHINDUCTOR_CACHE_DIR": str(COMPILE_CACHE)}
    got: dict[str, list[dict[str, Any]]] = {s: [{} for _ in range(rounds)] for s in sides}
    with ExitStack() as stack:
        gateways = {
            "eager": stack.enter_context(batch_gateway(prompts, GATEWAY_COMPILE="off")),
            "compiled": stack.enter_context(batch_gateway(prompts, **compiled)),
            "compiled_prefix_cache": stack.enter_context(
                batch_gateway(prompts, **compiled, GATEWAY_PREFIX_CACHE="true")
            ),
        }
        alone = gateways["eager"][2]  # each prompt's standard text, the eager gateway alone
        peers = {
            m: stack.enter_context(_llamacpp.server(d, slots=8)) for m, d in PEER_MODES.items()
        }
        for url in peers.values():
            with httpx.Client(base_url=url, timeout=600) as c:
                _stream(c, "none", prompts[0], {}, PEER_CACHE["peer"])  # warm-up
        for r in range(rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for (mode, decoding), n, side in itertools.product(MODES.items(), CLIENTS, order):
                if side in gateways:
                    url, key, _ = gateways[side]
                    ours = Clients(
                        url=url, key=key, count=n, per_client=per_client(n), decoding=decoding
                    )
                    result = _level(ours, prompts, alone)
                elif mode in peers:
                    # a fresh connection per request: llama-server may close a kept-alive
                    # one after a stream, and the next request on it fails
                    peer = Clients(
                        url=peers[mode],
                        key="none",
                        count=n,
                        per_client=per_client(n),
                        decoding={},
                        keepalive=False,
                        extra=PEER_CACHE[side],
                    )
                    result = _level(peer, prompts, alone)
                else:
                    continue  # llama-server has no auto mode
                got[side][r][f"{mode}_{n}"] = result
            print(f"   round {r + 1}: " + "; ".join(f"{s} {_brief(got[s][r])}" for s in sides))
    return _report(got, rounds, {str(n): per_client(n) for n in CLIENTS}, len(prompts))


def _report(
    got: dict[str, list[dict[str, Any]]], rounds: int, per_client: dict[str, int], prompts: int
) -> dict[str, Any]:
    ours, compiled, kept, peer, cached = (
        got[s] for s in ("eager", "compiled", "compiled_prefix_cache", "peer", "peer_prompt_cache")
    )
    equal = [
        lv["identical_to_alone"] for side in (peer, cached, compiled, kept) for r in side
        for lv in r.values()
    ]  # fmt: skip
    keys = [f"{m}_{n}" for m in MODES for n in CLIENTS]
    peer_keys = [f"{m}_{n}" for m in PEER_MODES for n in CLIENTS]
    gw = {k: _median(ours, k) for k in keys}
    gc = {k: _median(compiled, k) for k in keys}
    gk = {k: _median(kept, k) for k in keys}
    lc = {k: _median(peer, k) for k in peer_keys}
    lcc = {k: _median(cached, k) for k in peer_keys}
    return {
        "setup": {
            "prompts": prompts,
            "new_tokens": 64,
            "greedy": True,
            "clients": CLIENTS,
            "requests_per_client": per_client,
            "compiled": "GATEWAY_COMPILE=auto",
            "rounds": rounds,
            "paired": "every server up; each level on every server back to back, order "
            "alternating by round; ratios are medians of each round's ratio",
            "draft": "demo-code-draft@2",
            "peer": "llama-server (llama.cpp from llama-cpp-python's sdist, GGML_NATIVE), f32 "
            "GGUF, -np 8 -t 2, draft max 8",
            "peer_prompt_cache": "llama_server_tokens_per_s: cache_prompt false (every prompt "
            "prefilled, as the gateways without GATEWAY_PREFIX_CACHE do); "
            "llama_server_prompt_cache_tokens_per_s: its default, the prompts seen before in "
            "the run served from its slots' cache, against the compiled gateway with "
            "GATEWAY_PREFIX_CACHE=true (prompt_cache_ratios)",
        },
        "gateway_tokens_per_s": gw,
        "gateway_compiled_tokens_per_s": gc,
        "gateway_compiled_prefix_cache_tokens_per_s": gk,
        "llama_server_tokens_per_s": lc,
        "llama_server_prompt_cache_tokens_per_s": lcc,
        "rounds_tokens_per_s": {side: [_brief(r) for r in rs] for side, rs in got.items()},
        "gateway_itl_ms": {k: ours[-1][k]["itl_ms"] for k in keys},
        "gateway_compiled_itl_ms": {k: compiled[-1][k]["itl_ms"] for k in keys},
        "llama_server_itl_ms": {k: peer[-1][k]["itl_ms"] for k in lc},
        "ttft_ms_p50": {
            side: {k: rs[-1][k]["ttft_ms"]["p50"] for k in rs[-1]} for side, rs in got.items()
        },
        "equal_to_gateway_eager_alone": min(equal) if equal else None,
        "compiled_ratios": {
            **_goal_ratios(compiled, peer),
            "rounds": _goal_ratios(compiled, peer, each=True),
            "over_eager": {k: _paired(compiled, ours, k, (k,)) for k in keys},
        },
        "prompt_cache_ratios": {  # both with their prompt caches: compiled gateway over
            **_goal_ratios(kept, cached),  # llama-server, and over the gateway without
            "over_no_cache": {k: _paired(kept, compiled, k, (k,)) for k in keys},
        },
        "ratios": {
            "standard_1": _paired(ours, peer, "standard_1", ("standard_1",)),
            "speculative_1": _paired(ours, peer, "speculative_1", ("speculative_1",)),
            "auto_1_over_peer_best_1": _paired(
                ours, peer, "auto_1", ("standard_1", "speculative_1")
            ),
            "auto_8_over_peer_best_8": _paired(
                ours, peer, "auto_8", ("standard_8", "speculative_8")
            ),
            "gateway_auto_8_over_1": _paired(ours, ours, "auto_8", ("auto_1",)),
            "peer_standard_8_over_1": _paired(peer, peer, "standard_8", ("standard_1",)),
            "peer_speculative_8_over_standard_8": _paired(
                peer, peer, "speculative_8", ("standard_8",)
            ),
            "gateway_auto_8_over_standard_8": _paired(ours, ours, "auto_8", ("standard_8",)),
        },
    }


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key]["tokens_per_s"] for r in rounds), 1)


def _each(
    a: list[dict[str, Any]], b: list[dict[str, Any]], key: str, over: tuple[str, ...]
) -> list[float]:
    """Each round's tokens/s of `a` at `key` over `b`'s best level of `over`."""
    return [
        round(ra[key]["tokens_per_s"] / max(rb[k]["tokens_per_s"] for k in over), 3)
        for ra, rb in zip(a, b, strict=True)
    ]


def _paired(
    a: list[dict[str, Any]], b: list[dict[str, Any]], key: str, over: tuple[str, ...]
) -> float:
    """The median over rounds of each round's ratio (`_each`)."""
    return round(statistics.median(_each(a, b, key, over)), 3)


def _goal_ratios(
    compiled: list[dict[str, Any]], peer: list[dict[str, Any]], each: bool = False
) -> dict[str, Any]:
    """Issue 20's three throughput goals: the compiled gateway over llama-server, paired by
    round (medians; with `each`, every round's)."""
    if each:
        return {name: _each(compiled, peer, k, over) for name, (k, over) in GOALS.items()}
    return {name: _paired(compiled, peer, k, over) for name, (k, over) in GOALS.items()}


def _brief(levels: dict[str, Any]) -> dict[str, float]:
    return {k: v["tokens_per_s"] for k, v in levels.items()}
