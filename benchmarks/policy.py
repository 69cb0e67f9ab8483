"""No harm from auto mode: on a workload where speculation pays and on one where it does
not, auto mode's tokens/s must stay within 5% of the better fixed mode.

Each workload runs on a fresh gateway (so histories do not leak between workloads) with
three tenants whose policies fix the mode: standard, speculative (draft v2) and auto. The
auto tenant first gets a warm-up of requests (its acceptance history fills), then all three
run the same requests; tokens/s = completion tokens / wall time, over HTTP.

- pays: code prompts, greedy, 128 new tokens (the draft agrees often).
- does_not_pay: word-salad prompts, greedy, with the weaker draft v1 only (its greedy
  agreement is low off the code distribution, so drafting is mostly wasted work).
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


def _policies(draft_version: str) -> dict[str, dict[str, Any]]:
    spec = {"proposers": ["draft"], "draft_versions": [draft_version]}
    return {
        "standard": {"mode": "standard"},
        "speculative": {"mode": "speculative", "speculation": spec},
        "auto": {**AUTO, "speculation": spec},
    }


def _workloads(quick: bool) -> dict[str, tuple[list[str], dict[str, Any], str]]:
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
        "pays": (code[:n], {"temperature": 0, "max_tokens": 128}, "2"),
        "does_not_pay": (noise[:n], {"temperature": 0, "max_tokens": 128}, "1"),
    }


def _post(url: str, key: str, prompt: str, params: dict[str, Any]) -> tuple[int, str]:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": MODEL, "prompt": prompt, **params},
        headers={"authorization": f"Bearer {key}"},
        timeout=600,
    )
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"]), r.headers["x-decoding-mode"]


def _interleaved(
    url: str, keys: dict[str, str], prompts: list[str], params: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Every tenant runs every prompt; tenants alternate per prompt, so load changes on a
    shared machine hit all of them alike. tokens/s = tokens / time spent in its requests."""
    tokens = dict.fromkeys(keys, 0)
    seconds = dict.fromkeys(keys, 0.0)
    spec = dict.fromkeys(keys, 0)
    for prompt in prompts:
        for name, key in keys.items():
            t0 = time.perf_counter()
            n, mode = _post(url, key, prompt, params)
            seconds[name] += time.perf_counter() - t0
            tokens[name] += n
            spec[name] += mode == "speculative"
    return {
        name: {
            "tokens_per_s": tokens[name] / seconds[name],
            "speculative_share": spec[name] / len(prompts),
        }
        for name in keys
    }


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    report: dict[str, Any] = {"goal_auto_over_best": 0.95}
    for workload, (prompts, params, draft_version) in _workloads(quick).items():
        with gateway() as gw:
            keys = {
                name: gw.tenant(f"{workload.replace('_', '-')}-{name}", doc)
                for name, doc in _policies(draft_version).items()
            }
            _post(gw.url, keys["speculative"], prompts[0], params)  # warm-up: load the draft
            for prompt in prompts:  # auto learns its history
                _post(gw.url, keys["auto"], prompt, params)
            result: dict[str, Any] = _interleaved(gw.url, keys, prompts, params)
            best = max(result["standard"]["tokens_per_s"], result["speculative"]["tokens_per_s"])
            result["auto_over_best"] = result["auto"]["tokens_per_s"] / best
            result["draft_version"] = draft_version
            report[workload] = result
    return report
