"""The gateway's inference thread against a plain script: the demo target's decode steps
(1 token, KV cache) timed in a plain script's main thread, on the real app's inference
thread after it served every kind of request and a rollout, and on an app spoiled the way
the gateway once was (one parallel torch op in the event loop's default executor).

Each side runs in a fresh process (benchmarks/_inference_probe.py), sides alternate over
the rounds. ratio = gateway ms per step / plain script ms per step (goal about 1.0); the
spoiled ratio shows what the structural test (tests/integration/service/
test_inference_thread.py) protects against on this machine.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _probe(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks._inference_probe", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    rounds = 1 if quick else 3
    seen: dict[str, list[dict[str, Any]]] = {"reference": [], "gateway": [], "spoiled": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            seen["reference"].append(_probe("reference"))
            seen["gateway"].append(_probe("gateway", f"{tmp}/ok{r}"))
            seen["spoiled"].append(_probe("gateway", "--spoil", f"{tmp}/spoiled{r}"))
    ms = {side: statistics.median(p["ms_per_step"] for p in runs) for side, runs in seen.items()}
    cpu = {side: statistics.median(p["cpu"] for p in runs) for side, runs in seen.items()}
    return {
        "rounds": rounds,
        "ms_per_step": ms,
        "process_cpu": cpu,
        "gateway_over_reference": ms["gateway"] / ms["reference"],
        "spoiled_over_reference": ms["spoiled"] / ms["reference"],
        "runs": seen,
    }
