"""Arrivals that prefill together: GATEWAY_PREFILL_BUDGET 128 (one ~100-token prompt per
step, the behaviour before the budget existed) against the default 512, side by side.

    python -m benchmarks prefill_budget [--quick]

The demo pair, greedy, 64 new tokens on the held-out code prompts (86-141 prompt tokens),
streamed /v1/completions through concurrency.py's client at 8 concurrent clients, standard
and auto, and at 1 client standard (a lone request prefills alone either way: a check that
nothing else moved). One gateway process per setting and round (GATEWAY_COMPILE=auto, the
compile cache shared), rounds alternating the order; the report pools each setting's
rounds (tokens/s over the pooled wall time, percentiles over every request) and gives each
round's tokens/s, since on this 2-core machine rounds spread by 10-20%.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import _llamacpp
from benchmarks.concurrency import MODES, Clients, _prompts, _runs, _summary, batch_gateway

BUDGETS = (128, 512)
LEVELS = (("standard", 8), ("auto", 8), ("standard", 1))
COMPILE_CACHE = _llamacpp.ROOT / "var" / "bench-compile-cache"


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    prompts = _prompts()
    rounds = 1 if quick else 3
    pooled: dict[int, dict[str, list[Any]]] = {
        b: {f"{m}_{n}": [] for m, n in LEVELS} for b in BUDGETS
    }
    alone: dict[str, str] = {}
    for r in range(rounds):
        for budget in BUDGETS if r % 2 == 0 else tuple(reversed(BUDGETS)):
            with batch_gateway(
                prompts, GATEWAY_COMPILE="auto", TORCHINDUCTOR_CACHE_DIR=str(COMPILE_CACHE),
                GATEWAY_PREFILL_BUDGET=str(budget),
            ) as (url, key, texts):  # fmt: skip
                alone = alone or texts
                for mode, n in LEVELS:
                    per_client = 1 if quick else max(2, 8 // n)
                    clients = Clients(
                        url=url,
                        key=key,
                        count=n,
                        per_client=per_client,
                        decoding=MODES[mode],
                        offset=r,
                    )
                    got = _runs(clients, prompts)
                    pooled[budget][f"{mode}_{n}"].append(got)
                    print(f"   round {r + 1} budget {budget} {mode} {n}: {_rate(*got)}", flush=True)
    levels = {
        str(b): {name: _summary(runs, alone) for name, runs in pooled[b].items()} for b in BUDGETS
    }
    per_round = {
        str(b): {name: [_rate(rs, wall) for rs, wall in runs] for name, runs in pooled[b].items()}
        for b in BUDGETS
    }
    lo, hi = (levels[str(b)] for b in BUDGETS)
    return {
        "setup": {
            "prompts": len(prompts),
            "new_tokens": 64,
            "greedy": True,
            "budgets": BUDGETS,
            "prefill_chunk": 128,
            "rounds": rounds,
            "compiled": "GATEWAY_COMPILE=auto",
        },
        "levels": levels,
        "tokens_per_s_by_round": per_round,
        "ratios_512_over_128": {
            name: round(hi[name]["tokens_per_s"] / lo[name]["tokens_per_s"], 3) for name in lo
        },
    }


def _rate(runs: list[dict[str, Any]], wall: float) -> float:
    """Tokens/s of one round: every request's tokens over the round's wall time."""
    return round(sum(x["tokens"] for x in runs) / wall, 1)
