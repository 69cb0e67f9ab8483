"""How long the demo gateway takes to be ready with GATEWAY_COMPILE=on: a cold start (a
fresh var folder: empty compile cache and store) with the compile helper
(GATEWAY_COMPILE_HELPER=true, gateway/speed/precompile.py) and without, alternating, and a
restart on the helper's folder (every step stored: loaded, no helper).

    python -m benchmarks compile_startup [--quick]

Seconds from starting `python -m gateway` to GET /ready answering 200 (the process start,
migrations, model loads, compiles and the cost probe included). Rounds alternate the two
settings so that the machine's drifts hit both; --quick runs one round.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._server import gateway


def _ready_after(var_dir: Path, helper: bool) -> float:
    t0 = time.perf_counter()
    with gateway(
        GATEWAY_COMPILE="on", GATEWAY_COMPILE_HELPER=str(helper).lower(),
        GATEWAY_VAR_DIR=str(var_dir),
    ):  # fmt: skip
        return round(time.perf_counter() - t0, 1)


def run(out_dir: Path, quick: bool) -> dict[str, Any]:
    rounds = 1 if quick else 2
    seconds: dict[str, list[float]] = {"cold_helper": [], "cold_alone": [], "restart": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for helper in (True, False) if r % 2 == 0 else (False, True):
                var_dir = Path(tmp) / f"round{r}-{'helper' if helper else 'alone'}"
                seconds["cold_helper" if helper else "cold_alone"].append(
                    _ready_after(var_dir, helper)
                )
                if helper:  # the same folder again: every step is stored
                    seconds["restart"].append(_ready_after(var_dir, helper=True))
    median = {k: statistics.median(v) for k, v in seconds.items()}
    return {
        "setup": {"compile": "on", "models": "demo manifest", "rounds": rounds},
        "ready_s": seconds,
        "median_s": median,
        "cold_alone_over_helper": round(median["cold_alone"] / median["cold_helper"], 2),
    }
