"""Greedy output alone and inside mixed batches, in-process, on the demo pair: how often
batched rounding parts a request from the same request served alone, and whether every
parting is a near tie (issue 14's exactness, on whatever CPU this runs on).

    python -m benchmarks batch_exactness [--quick]

Why it is needed: a BLAS picks its kernel by the shape of a product, and the attention
kernel splits its work by the shape of the batch, so a row's logits can depend in the last
bits on how many rows and tokens share its forward. Whether it does depends on the CPU and
its BLAS: on some machines no run shows it, on others MKL rounds a row of a linear layer in
products of 1, 2-3 and 4+ rows differently (`blas_row_classes` below) and
scaled_dot_product_attention's output for one query changes with the number of queries,
rows and padded keys (docs/benchmarks.md names the machines). Fp32 differences of ~1e-7
flip a greedy choice only where the target's two best tokens are that close.

What runs: the 16 code and held-out prompts, 64 greedy tokens, with the top-2 logprobs.
Reference: each prompt alone, standard decoding (a batch of one row). Compared with it:
the same prompt decoded speculatively alone (draft v2), and inside batches of 8 rows mixing
standard and speculative rows whose joins are staggered (half join at step 0, the rest two
steps later). A parting is where a row's tokens first differ from the reference: the
report gives the position and both runs' logprob gap between the two tokens; a parting is a
near tie when both gaps are at most TIE.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TIE = 1e-3  # logprob gap; fp32 logits differ by ~1e-6 between kernels
NEW_TOKENS = 64
PROMPT_SETS = [
    Path(__file__).resolve().parent / "prompts" / f"{n}.jsonl" for n in ("code", "heldout")
]

CHILD = """
import json, sys
import torch
from benchmarks._pairs import load_pair, load_prompts
from benchmarks.batch_exactness import PROMPT_SETS, blas_row_classes, compare
from gateway.engine import DecodeRequest, Engine, Finished, SamplingParams, init_torch_thread

init_torch_thread()
new_tokens, rows = int(sys.argv[1]), 8
pair = load_pair()
draft = pair.drafts["v2"]
eng = Engine(pair.target)
ids = [x for path in PROMPT_SETS for x in load_prompts(eng.tokenizer, path)]
sp = SamplingParams(temperature=0.0, max_tokens=new_tokens, logprobs=True, top_logprobs=2)
batch = eng.batch(rows)

def decode(jobs):  # jobs: (prompt index, speculative?, join step) -> results in job order
    out, pending, step = {}, sorted(enumerate(jobs), key=lambda j: j[1][2]), 0
    while pending or batch.rows:
        while pending and pending[0][1][2] <= step:
            n, (i, spec, _) = pending.pop(0)
            kw = {"mode": "speculative", "proposer": "draft"} if spec else {}
            row = batch.add(eng.prepare(DecodeRequest(ids[i], sp, **kw), draft if spec else None))
            out[id(row)] = n
        for row, events in batch.step():
            for e in events:
                if isinstance(e, Finished):
                    out[out.pop(id(row))] = e.result
        step += 1
    return [out[n] for n in range(len(jobs))]

def top(result):
    return [[(t, v) for t, _, v in lp.top] for lp in result.logprobs]

alone = {i: decode([(i, False, 0)])[0] for i in range(len(ids))}

def against_alone(i, res, spec):
    mode = "speculative" if spec else "standard"
    return compare(alone[i].token_ids, top(alone[i]), res.token_ids, top(res), i, mode)

runs = {"speculative_alone": [], "batched": []}
for i in range(len(ids)):
    runs["speculative_alone"].append(against_alone(i, decode([(i, True, 0)])[0], True))
for start in range(0, len(ids), rows):  # batches of 8 prompts; then the same with modes swapped
    for flip in (False, True):
        jobs = [((start + r) % len(ids), (r % 2 == 1) != flip, 0 if r < rows // 2 else 2)
                for r in range(rows)]
        for (i, spec, _), res in zip(jobs, decode(jobs)):
            runs["batched"].append(against_alone(i, res, spec))
weight_major = "forward" in pair.target.model.lm_head.__dict__  # cpu_linear patched it
print(json.dumps({"runs": runs, "blas_row_classes": blas_row_classes(), "prompts": len(ids),
                  "threads": torch.get_num_threads(), "weight_major": weight_major}))
"""


def compare(
    ref: list[int], ref_top: list[list[tuple[int, float]]],
    got: list[int], got_top: list[list[tuple[int, float]]], prompt: int, mode: str,
) -> dict[str, Any]:  # fmt: skip
    """One row against its reference: equal, or where it parted and the two runs' logprob
    gaps between the two tokens there (None where a run's top-2 lacks one of them)."""
    out: dict[str, Any] = {"prompt": prompt, "mode": mode, "equal": list(got) == list(ref)}
    if out["equal"]:
        return out
    j = next((n for n, (a, b) in enumerate(zip(ref, got, strict=False)) if a != b), None)
    if j is None:  # one is a prefix of the other: a length difference, not a choice
        out["parted_at"] = min(len(ref), len(got))
        return out
    a, b = ref[j], got[j]

    def gap(tops: list[tuple[int, float]], best: int, other: int) -> float | None:
        lp = dict(tops)
        return round(lp[best] - lp[other], 7) if best in lp and other in lp else None

    out.update(parted_at=j, tokens=[a, b], gap_alone=gap(ref_top[j], a, b),
               gap_here=gap(got_top[j], b, a))  # fmt: skip
    return out


def blas_row_classes(shape: tuple[int, int] = (8192, 256), most: int = 64) -> dict[str, str]:
    """Which row counts round a row of x @ W^T (torch's linear) and W @ x^T (the weight-major
    form of gateway/speed/cpu_linear.py) alike: runs of counts with the same class, e.g.
    "1:0 2-3:1 4-64:2"."""
    import torch

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=gen)
    x = torch.randn(most, shape[1], generator=gen)
    out = {}
    for form in ("x@W^T", "W@x^T"):
        firsts: list[torch.Tensor] = []
        runs: list[list[int]] = []
        for m in range(1, most + 1):
            y = (x[:m] @ w.T)[0] if form == "x@W^T" else (w @ x[:m].T)[:, 0]
            c = next((i for i, f in enumerate(firsts) if torch.equal(f, y)), None)
            if c is None:
                firsts.append(y)
                c = len(firsts) - 1
            if runs and runs[-1][2] == c:
                runs[-1][1] = m
            else:
                runs.append([m, m, c])
        out[form] = " ".join(f"{a}-{b}:{c}" if a != b else f"{a}:{c}" for a, b, c in runs)
    return out


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    parted = [r for r in rows if not r["equal"]]
    near = [
        r for r in parted
        if r.get("gap_alone") is not None and r.get("gap_here") is not None
        and r["gap_alone"] <= TIE and r["gap_here"] <= TIE
    ]  # fmt: skip
    return {
        "rows": len(rows),
        "identical": len(rows) - len(parted),
        "identical_share": round((len(rows) - len(parted)) / max(1, len(rows)), 4),
        "partings": parted,
        "every_parting_a_near_tie": len(near) == len(parted),
    }


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(16 if quick else NEW_TOKENS)],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    got = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {
        "setup": {
            "prompts": got["prompts"],
            "new_tokens": 16 if quick else NEW_TOKENS,
            "batch_rows": 8,
            "draft": "demo-code-draft@2",
            "dtype": "float32",
            "near_tie_logprob_gap": TIE,
            "cpu_avx512": "avx512f" in cpu,
            "torch_threads": got["threads"],
            "weight_major_linear": got["weight_major"],  # cpu_linear's measured choice
            "blas_row_classes": got["blas_row_classes"],
        },
        "speculative_alone_vs_standard_alone": _summary(got["runs"]["speculative_alone"]),
        "batched_vs_standard_alone": _summary(got["runs"]["batched"]),
    }
