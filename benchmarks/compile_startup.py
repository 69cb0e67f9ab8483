"""How long the demo gateway takes to be ready with GATEWAY_COMPILE=on: a cold start (a
fresh var folder: empty compile cache and store) and a restart on the same folder (every
step stored: loaded, not traced).

    python -m benchmarks compile_startup [--quick]

Seconds from starting `python -m gateway` to GET /ready answering 200 (the process start,
migrations, model loads, compiles and the cost probe included); --quick runs one round.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._server import gateway


def _ready_after(var_dir: Path) -> float:
    t0 = time.perf_counter()
    with gateway(GATEWAY_COMPILE="on", GATEWAY_VAR_DIR=str(var_dir)):
        return round(time.perf_counter() - t0, 1)


def run(out_dir: Path, quick: bool) -> dict[str, Any]:
    rounds = 1 if quick else 2
    seconds: dict[str, list[float]] = {"cold": [], "restart": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            var_dir = Path(tmp) / f"round{r}"
            seconds["cold"].append(_ready_after(var_dir))
            seconds["restart"].append(_ready_after(var_dir))  # every step is stored
    return {
        "setup": {"compile": "on", "models": "demo manifest", "rounds": rounds},
        "ready_s": seconds,
        "median_s": {k: statistics.median(v) for k, v in seconds.items()},
    }
