"""No harm from auto mode: on a workload where speculation pays and on one where it does
not, auto mode's tokens/s must stay within 5% of the better fixed mode.

Each workload runs on a fresh gateway (so histories do not leak between workloads) with
three tenants whose policies fix the mode: standard, speculative (draft v2) and auto. The
auto tenant first gets a warm-up of requests (its acceptance history fills), then all three
run the same requests; tokens/s = completion tokens / wall time, over HTTP.

- pays: code prompts, greedy, 128 new tokens (the draft agrees often).
- does_not_pay: prose-like noise prompts sampled at temperature 1.5 (the draft rarely
  agrees with the target's sampled tokens, so drafting is wasted work).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks._server import gateway

PROMPTS = Path(__file__).resolve().parent / "prompts" / "code.jsonl"
MODEL = "demo-code-target"
AUTO = {"mode": "auto", "auto": {"min_samples": 3, "probe_rate": 0.05}}
POLICIES: dict[str, dict[str, Any]] = {
    "standard": {"mode": "standard"},
    "speculative": {"mode": "speculative", "speculation": {"proposers": ["draft"]}},
    "auto": {**AUTO, "speculation": {"proposers": ["draft"]}},
}


def _workloads(quick: bool) -> dict[str, tuple[list[str], dict[str, Any]]]:
    code = [json.loads(x)["prompt"] for x in PROMPTS.read_text().splitlines() if x.strip()]
    rng = random.Random(0)
    words = [
        "lorem",
        "quantum",
        "velvet",
        "harbor",
        "seven",
        "mosaic",
        "drift",
        "ember",
        "tundra",
        "glyph",
        "orbit",
        "saffron",
        "lattice",
        "murmur",
        "cobalt",
    ]
    noise = [" ".join(rng.choice(words) for _ in range(24)) for _ in range(len(code))]
    n = 3 if quick else len(code)
    return {
        "pays": (code[:n], {"temperature": 0, "max_tokens": 128}),
        "does_not_pay": (noise[:n], {"temperature": 1.5, "max_tokens": 128}),
    }


def _run(url: str, key: str, prompts: list[str], params: dict[str, Any]) -> tuple[float, list[str]]:
    tokens, modes, t0 = 0, [], time.perf_counter()
    for prompt in prompts:
        r = httpx.post(
            f"{url}/v1/completions",
            json={"model": MODEL, "prompt": prompt, **params},
            headers={"authorization": f"Bearer {key}"},
            timeout=600,
        )
        r.raise_for_status()
        tokens += int(r.json()["usage"]["completion_tokens"])
        modes.append(r.headers["x-decoding-mode"])
    return tokens / (time.perf_counter() - t0), modes


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    report: dict[str, Any] = {"goal_auto_over_best": 0.95}
    for workload, (prompts, params) in _workloads(quick).items():
        with gateway() as gw:
            keys = {
                name: gw.tenant(f"{workload.replace('_', '-')}-{name}", doc)
                for name, doc in POLICIES.items()
            }
            _run(gw.url, keys["speculative"], prompts[:1], params)  # warm-up: load the draft
            _run(gw.url, keys["auto"], prompts, params)  # auto learns its history
            result: dict[str, Any] = {}
            for name, key in keys.items():
                tps, modes = _run(gw.url, key, prompts, params)
                result[name] = {
                    "tokens_per_s": tps,
                    "speculative_share": modes.count("speculative") / len(modes),
                }
            best = max(result["standard"]["tokens_per_s"], result["speculative"]["tokens_per_s"])
            result["auto_over_best"] = result["auto"]["tokens_per_s"] / best
            report[workload] = result
    return report
