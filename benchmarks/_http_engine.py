"""The in-process side of the HTTP benchmark, run as its own process by benchmarks/http.py:

    python -m benchmarks._http_engine '{"prompts": [...], "new_tokens": 128, "modes": {...}}'

Loads the demo pair in the main thread of a plain script (what a user of the engine would
write), decodes every prompt once per mode after one warm-up, and prints one JSON line:
tokens/s and process CPU use (CPU seconds / wall seconds) per mode.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from benchmarks._pairs import load_pair
from gateway.engine import DecodeRequest, Engine, SamplingParams


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def main(args: dict[str, Any]) -> dict[str, Any]:
    pair = load_pair()  # the demo pair as the gateway serves it
    target, draft = pair.target, pair.drafts["v2"]
    engine = Engine(target)
    ids = [
        tuple(target.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in args["prompts"]
    ]

    def decode(p: tuple[int, ...], decoding: dict[str, Any]) -> int:
        speculative = decoding["mode"] == "speculative"
        req = DecodeRequest(
            prompt_ids=p,
            sampling=SamplingParams(temperature=0.0, max_tokens=args["new_tokens"]),
            mode=decoding["mode"],
            proposer=decoding.get("proposer") if speculative else None,
            k_min=decoding.get("k_min", 1),
            k_max=decoding.get("k_max", 8),
        )
        return len(engine.run(req, draft=draft if speculative else None).token_ids)

    out: dict[str, Any] = {}
    for name, decoding in args["modes"].items():
        decode(ids[0], decoding)  # warm-up
        tokens, c0, t0 = 0, _cpu_seconds(), time.perf_counter()
        for p in ids:
            tokens += decode(p, decoding)
        wall = time.perf_counter() - t0
        out[name] = {"tokens_per_s": tokens / wall, "cpu": (_cpu_seconds() - c0) / wall}
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
