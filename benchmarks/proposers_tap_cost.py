"""What the hidden-state taps cost decoding that does not use them (issue 47).

    python -m benchmarks proposers_tap_cost

The feature head needs the target's hidden states; the forwards hand them back only when a
row's proposer reads them (batch/forward.py `FeatureTap`). This checks that standard
decoding pays nothing for that: the same standard decoding, timed with this tree's gateway
package and with the tree before the taps (`TAP_COST_BASE`, default the commit before
them, extracted with `git archive`), each in its own process, interleaved `rounds` times:

- alone: Engine.run on the held-out prompts (the single-request loop), 64 new tokens each;
- batch: the same prompts as one continuous batch of 8 rows (Engine.batch; the lean
  decoder's path).

Reported: tokens/s per tree (median over rounds), current / base, and whether both trees
produced the same tokens.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "benchmarks" / "prompts" / "heldout.jsonl"
TARGET = ROOT / "models_registry" / "demo" / "demo-code-target-v1"
BASE = os.environ.get("TAP_COST_BASE", "edf7d1f^")
NEW_TOKENS = 64
ROWS = 8


def _measure(n_prompts: int) -> dict[str, Any]:
    """In the child: standard decoding with whichever `gateway` package is on the path."""
    import torch

    import gateway
    from gateway.engine import DecodeRequest, Engine, SamplingParams
    from gateway.engine.schema import Finished
    from gateway.speed import load_fast

    engine = Engine(load_fast(TARGET, device="cpu"))
    tok = engine.tokenizer
    files = [json.loads(x) for x in HELDOUT.read_text().splitlines() if x.strip()][:n_prompts]
    prompts = [tuple(tok(f["prompt"], add_special_tokens=False)["input_ids"]) for f in files]
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    with torch.inference_mode():
        engine.run(DecodeRequest(prompts[0], sp))  # warm-up
        t0 = time.perf_counter()
        alone = [engine.run(DecodeRequest(p, sp)).token_ids for p in prompts]
        alone_s = time.perf_counter() - t0
        batch = engine.batch(ROWS)
        t0 = time.perf_counter()
        waiting, done = list(enumerate(prompts)), {}
        rows: dict[int, int] = {}
        while waiting or batch.rows:
            while waiting and batch.free:
                i, p = waiting.pop(0)
                rows[id(batch.add(engine.prepare(DecodeRequest(p, sp))))] = i
            for row, events in batch.step():
                for e in events:
                    if isinstance(e, Finished):
                        done[rows[id(row)]] = e.result.token_ids
        batch_s = time.perf_counter() - t0
    tokens = sum(len(t) for t in alone)
    return {
        "gateway": str(Path(gateway.__file__).parent),
        "alone_tokens_per_s": tokens / alone_s,
        "batch_tokens_per_s": sum(len(t) for t in done.values()) / batch_s,
        "alone_tokens": [list(t) for t in alone],
        "batch_tokens": [list(done[i]) for i in range(len(prompts))],
    }


def _base_tree(into: Path) -> Path:
    """The gateway package as of BASE, under `into`."""
    data = subprocess.run(
        ["git", "archive", "--format=tar", BASE, "gateway"], cwd=ROOT, check=True,
        capture_output=True,
    ).stdout  # fmt: skip
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def _child(tree: Path, n_prompts: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # -c, not the script's path: benchmarks/ holds an http.py that would shadow the stdlib's
    code = (
        f"import runpy, sys; sys.argv = ['x', '--child', '{n_prompts}']; "
        f"runpy.run_path({__file__!r}, run_name='__main__')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True,
        cwd=tree,
    ).stdout  # fmt: skip
    return dict(json.loads(out.strip().splitlines()[-1]))


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    n_prompts = 4 if quick else 12
    rounds = 1 if quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        base = _base_tree(Path(tmp))
        got: dict[str, list[dict[str, Any]]] = {"base": [], "current": []}
        for _ in range(rounds):
            for name, tree in (("base", base), ("current", ROOT)):
                got[name].append(_child(tree, n_prompts))
    assert got["base"][0]["gateway"] != got["current"][0]["gateway"]
    out: dict[str, Any] = {"base": BASE, "prompts": n_prompts, "new_tokens": NEW_TOKENS,
                           "batch_rows": ROWS, "rounds": rounds}  # fmt: skip
    for mode in ("alone", "batch"):
        med = {n: statistics.median(r[f"{mode}_tokens_per_s"] for r in got[n]) for n in got}
        out[mode] = {
            "base_tokens_per_s": round(med["base"], 2),
            "current_tokens_per_s": round(med["current"], 2),
            "current_over_base": round(med["current"] / med["base"], 3),
            "runs_base": [round(r[f"{mode}_tokens_per_s"], 2) for r in got["base"]],
            "runs_current": [round(r[f"{mode}_tokens_per_s"], 2) for r in got["current"]],
            "same_tokens": got["base"][0][f"{mode}_tokens"] == got["current"][0][f"{mode}_tokens"],
        }
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(_measure(int(sys.argv[2]))))
