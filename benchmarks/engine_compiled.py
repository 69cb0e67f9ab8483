"""Eager vs compiled batch steps (gateway/speed/compiled.py) on the demo pair, in-process:
standard and speculative (draft v2), 1 and 8 rows, greedy, held-out prompts; plus the
warm-up time cold (an empty inductor cache) and from the cache (a restart: the steps
precompiled by the cold start, speed/store.py Precompiled, load without tracing).

    python -m benchmarks engine_compiled [--quick]

Each measurement runs in a process of its own: a cold one (fresh TORCHINDUCTOR_CACHE_DIR:
compiles, then times eager and compiled rounds alternately) and a warm one on the same
cache (how long a restart's warm-up takes). tokens/s = generated tokens / wall time of the
batch, every row joining at step 0. `identical` counts rows whose compiled output equals
the eager output token for token. llama.cpp is measured side by side with the gateway, eager
and compiled, over HTTP in `python -m benchmarks llamacpp` (benchmarks/llamacpp.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, sys, time
from pathlib import Path
from benchmarks._pairs import load_pair
from benchmarks.concurrency import _prompts
from gateway.engine import DecodeRequest, Engine, Finished, SamplingParams, init_torch_thread
from gateway.speed.warmup import CompileOptions, compiled_model

from gateway.speed import cpu_linear, keep_verdicts
init_torch_thread()
rounds, new_tokens, only_warmup = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
keep_verdicts(cache / "linear-verdicts.json")  # as the gateway: the restart keeps the forms
pair = load_pair(compiled=True)  # the linear forward timed as the gateway does when compiling
def weight_major(lm):
    return cpu_linear.uses_weight_major(lm.model)
t0 = time.perf_counter()
store = cache / "precompiled"  # as the gateway's
options = CompileOptions(store=store)
fast_target, t_target = compiled_model(pair.target, 8, False, options, lambda m: None)
fast_draft, t_draft = compiled_model(pair.drafts["v2"], 8, True, options, lambda m: None)
out = {"warmup_s": {"target": round(t_target, 1), "draft_v2": round(t_draft, 1),
                    "total": round(time.perf_counter() - t0, 1)},
       "weight_major_linear": {"target": weight_major(pair.target),
                               "draft_v2": weight_major(pair.drafts["v2"])}}
if not only_warmup:
    eng = Engine(pair.target)
    fast = Engine(fast_target)
    ids = [tuple(eng.tokenizer(p)["input_ids"]) for p in _prompts()]
    def reqs(mode, rows):
        sp = SamplingParams(temperature=0.0, max_tokens=new_tokens)
        kw = {} if mode == "standard" else {"mode": "speculative", "proposer": "draft"}
        return [DecodeRequest(ids[i % len(ids)], sp, **kw) for i in range(rows)]
    batches = {id(eng): eng.batch(8), id(fast): fast.batch(8)}  # caches allocated once
    def go(engine, draft, mode, rows):
        batch = batches[id(engine)]
        got = {}
        for r in reqs(mode, rows):
            got[id(batch.add(engine.prepare(r, draft if mode != "standard" else None)))] = None
        order = list(got)
        t = time.perf_counter()
        while batch.rows:
            for row, events in batch.step():
                for e in events:
                    if isinstance(e, Finished):
                        got[id(row)] = e.result.token_ids
        wall = time.perf_counter() - t
        toks = [got[k] for k in order]
        return sum(len(x) for x in toks) / wall, toks
    for mode in ("standard", "speculative"):
        for rows in (1, 8):
            e, c, same = [], [], 0
            go(eng, pair.drafts["v2"], mode, rows)  # untimed: first allocations
            go(fast, fast_draft, mode, rows)
            for _ in range(rounds):
                te, a = go(eng, pair.drafts["v2"], mode, rows)
                tc, b = go(fast, fast_draft, mode, rows)
                e.append(te); c.append(tc)
                same = sum(x == y for x, y in zip(a, b))
            e.sort(); c.sort()
            out[f"{mode}_{rows}"] = {
                "eager_tok_s": round(e[len(e) // 2], 1), "compiled_tok_s": round(c[len(c) // 2], 1),
                "compiled_over_eager": round(c[len(c) // 2] / e[len(e) // 2], 3),
                "identical_rows": f"{same}/{rows}",
            }
print(json.dumps(out))
"""


def _child(cache: str, rounds: int, new_tokens: int, only_warmup: bool) -> dict[str, Any]:
    """A process compiling (or, from `cache`, loading) the demo pair's steps; the linear
    forwards the first one timed are kept there too (cpu_linear.keep_verdicts, as the
    gateway does), so that a restart traces the code its precompiled steps were built from."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    args = [str(rounds), str(new_tokens), "1" if only_warmup else "0"]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as cache:
        cold = _child(cache, 1 if quick else 3, 32 if quick else 64, False)
        warm = _child(cache, 1, 1, True)
    return {
        "setup": {"rows_compiled_for": 8, "draft": "demo-code-draft@2", "greedy": True},
        "cold": cold,
        "restart_warmup_s": warm["warmup_s"],
        "llama_cpp": "side by side over HTTP in benchmarks/reports/llamacpp.json "
        "(python -m benchmarks llamacpp: eager and compiled gateway against llama-server)",
    }
