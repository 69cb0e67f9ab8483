"""Targets of the sizes people run, random weights: start-up, memory and tokens/s.

    python -m benchmarks realistic [--quick]

Models: Qwen2-shaped targets with Qwen2.5-0.5B's and Qwen2.5-1.5B's configs (hidden,
layers, heads, KV heads, intermediate, vocabulary 151,936, tied embeddings), random weights
built here on the fly and saved as bf16 safetensors (as those checkpoints ship) under
var/bench-realistic/ (reused by the next run while the recipe is the same; nothing comes
from the hub). The context is cut to CONTEXT positions: the batch gives every row a KV slot
of the model's full context, and Qwen2.5's 32,768 positions would reserve 6.4 GB (0.5B)
and 15 GB (1.5B) of fp32 keys and values for 8 rows (see `kv_at_full_context` in the
report). The draft is the target's own first DRAFT_LAYERS layers with its final norm and
(tied) head: a truncated copy, saved as a model of its own, full vocabulary head.

Weights: random weights at the usual scale decode into one token repeated (with tied
embeddings the last token's own embedding wins). Here every layer writes into the residual
stream at unit scale (projections N(0, 1/fan_in), embeddings N(0, 0.02)), the first
DRAFT_LAYERS layers at full strength and the later ones scaled down so that together they
move the residual stream by about LATER of the first layers' share: the draft then agrees
with the target's greedy choice often but not always (the report gives the acceptance),
and greedy output wanders over the vocabulary instead of repeating one token.

Tokenizer: the demo's byte-level BPE (8,192 tokens). The embedding rows of ids past it and
of its special tokens (end of text among them) are zero, so their logits are 0 and never
the greedy choice: every request decodes exactly its max_tokens, and every id produced
means a string.

Per model and dtype (fp32, bf16), each part in a process of its own (never two models in
memory at once; the models: _realistic_models.py, the measuring children:
_realistic_children.py):

1. a first start and a restart through the gateway's own start path (serving ModelPool
   from a manifest: sha256 of the shards, load_model with its family check, linear-form
   verdict and lean decoder parity check, the cost probe of 1..8 rows), each part timed;
   the draft's load on first use likewise;
2. on the restarted process: resident memory against the weights plus the KV slots of an
   8-row batch (target and draft), and standard and speculative tokens/s through the
   engine's continuous batch (`Engine.batch(8)`, what the inference thread steps) at 1
   client (the prompts one after another) and 8 (8 requests in one batch);
3. Hugging Face `generate` (greedy, the same prompts and token counts) on the model as
   transformers loads it: one prompt at a time, and a left-padded batch of 8.

llama.cpp: only where a llama-server was built (benchmarks/_llamacpp.py); otherwise the
report says it was not run. Goals (pass/fail in `goals`): ready in under 60 s for the 1.5B
target on a restart, resident memory under 1.3x weights + KV budget, standard tokens/s at
1 client at least 0.9x HF `generate`, speculative above standard at 1 client. The start's
parts are fitted against the parameter count and extrapolated to a 7B (Qwen2.5-7B) start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._realistic_children import ROWS, gateway_child, hf_child, torch_threads
from benchmarks._realistic_models import (
    CONTEXT,
    DEMO,
    DRAFT_LAYERS,
    DRAFT_VOCAB,
    LATER,
    RECIPE,
    ROOT,
    build,
)

CACHE = ROOT / "var" / "bench-realistic"
PROMPTS = Path(__file__).resolve().parent / "prompts" / "heldout.jsonl"


def _child(kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """`python -m benchmarks.realistic <kind> <json>` in a process of its own; its last line
    of stdout is its JSON result."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.realistic", kind, json.dumps(args)],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )  # fmt: skip
    sys.stderr.write(done.stderr[-3000:] if done.returncode else _progress(done.stderr))
    if done.returncode:
        raise RuntimeError(f"{kind} child failed ({done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _progress(stderr: str) -> str:
    return "".join(line + "\n" for line in stderr.splitlines() if line.startswith("      "))


PLANS: dict[str, dict[str, Any]] = {
    "full": {"cases": ("qwen2.5-0.5b/float32", "qwen2.5-0.5b/bfloat16", "qwen2.5-1.5b/bfloat16",
                       "qwen2.5-1.5b/float32"),
             "new_tokens": 32, "one_client": 3, "clients": (1, 8), "rounds": 3},
    "quick": {"cases": ("qwen2-tiny/float32",), "new_tokens": 8, "one_client": 1,
              "clients": (1, 8), "rounds": 1},
}  # fmt: skip
"""Cases run in order, "shape/dtype[/linear]": linear pins the fp32 linear form as
GATEWAY_CPU_LINEAR does (off, on; default auto: measured at the first start and kept, as the
gateway does). Each case starts twice on the same var dir: a first start (which measures
and keeps what the gateway keeps) and the restart that is measured. REALISTIC_CASES=a,b
overrides the list (those cases run again); REALISTIC_PARTS=first or =rest runs only the
first starts or only the restarts (a case's first start is kept in
var/bench-realistic/partial.json for its restart), so that a long run can be split, and
=none only writes the report; REALISTIC_RESUME=1 keeps the cases (and first starts) an
earlier run finished and runs the rest, merging them into one report."""
PARAMS_7B = 7_615_616_512  # Qwen2.5-7B (hidden 3584, 28 layers, 4 KV heads, untied head)
SETTINGS = ("new_tokens", "one_client", "clients", "rounds")


def run(out_dir: Path, quick: bool = False, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    plan = dict(plan or PLANS["quick" if quick else "full"])
    named = bool(os.environ.get("REALISTIC_CASES"))  # run, whatever an earlier run did
    if named:
        plan["cases"] = tuple(os.environ["REALISTIC_CASES"].split(","))
    for key in SETTINGS:  # REALISTIC_CLIENTS=1,8 and so on
        if os.environ.get(f"REALISTIC_{key.upper()}"):
            values = tuple(int(x) for x in os.environ[f"REALISTIC_{key.upper()}"].split(","))
            plan[key] = values if key == "clients" else values[0]
    parts = os.environ.get("REALISTIC_PARTS", "first,rest").split(",")  # none: report only
    prompts = _prompt_ids(max(plan["clients"]))
    common = {k: plan[k] for k in SETTINGS}
    partial = CACHE / "partial.json"
    resume = os.environ.get("REALISTIC_RESUME") == "1" and partial.exists()
    done: dict[str, Any] = json.loads(partial.read_text()) if resume else {}
    built: dict[str, Any] = done.pop("_models", {})
    firsts: dict[str, Any] = done.pop("_first", {})
    # every case finished before, but those named to run again (kept in each partial write)
    cases: dict[str, Any] = {k: v for k, v in done.items() if not named or k not in plan["cases"]}
    for case in plan["cases"]:
        if case in cases:  # resumed: finished before
            continue
        shape, dtype, *pin = case.split("/")
        linear = {"off": False, "on": True}.get(pin[0] if pin else "auto")
        folder = CACHE / f"{shape}-r{RECIPE}"
        var = CACHE / "var" / case.replace("/", "-")  # the gateway's var dir: what it keeps
        print(f"   {case} ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
        if shape not in built:
            built[shape] = _child("build", {"shape": shape, "folder": str(folder)})
        base = {"folder": str(folder), "var": str(var), "dtype": dtype, "cpu_linear": linear}
        if "first" in parts:
            shutil.rmtree(var, ignore_errors=True)
            firsts[case] = _child("gateway", base)
            cases.pop(case, None)
        if "rest" in parts and case not in firsts:
            print(f"   {case}: no first start to restart after", file=sys.stderr, flush=True)
        elif "rest" in parts:
            restart = _child("gateway", {**base, **common, "decode": True, "prompts": prompts})
            hf = _child("hf", {**base, "prompts": prompts})
            summary = _case(built[shape], firsts.pop(case), restart, hf, plan["one_client"])
            cases[case] = {"plan": common, **summary}
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({**cases, "_models": built, "_first": firsts}, indent=1))
    result = {
        "setup": {
            **common, "context": CONTEXT, "batch_rows": ROWS, "draft_layers": DRAFT_LAYERS,
            "draft_vocab": DRAFT_VOCAB, "later_layers_share": LATER,
            "prompts": str(PROMPTS.relative_to(ROOT)), "weights_on_disk": "bf16 safetensors",
            "tokenizer": "demo byte-level BPE, 8192", "torch_threads": torch_threads(),
            "machine": _machine(),
        },
        "models": {k: v for k, v in built.items() if any(c.startswith(k + "/") for c in cases)},
        "cases": cases,
        "first_starts_pending": sorted(firsts),
        "llamacpp": _llamacpp(),
    }  # fmt: skip
    result["goals"] = _goals(cases)
    result["start_7b_extrapolated"] = _extrapolate(cases, built)
    result["first_start_7b_extrapolated"] = _extrapolate(cases, built, "first")
    _plot(out_dir / "realistic.png", cases)
    return result


def _prompt_ids(n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(DEMO), local_files_only=True)
    lines = [json.loads(x)["prompt"] for x in PROMPTS.read_text().splitlines() if x.strip()]
    return [tok(lines[i % len(lines)], add_special_tokens=False)["input_ids"] for i in range(n)]


def _case(
    built: dict[str, Any], first: dict[str, Any], restart: dict[str, Any],
    hf: dict[str, Any], one_client: int,
) -> dict[str, Any]:  # fmt: skip
    runs = restart.pop("runs")
    ref, hf_ref = runs["standard_1"]["outputs"], runs["hf_generate_1"]["outputs"]
    pairs = {
        "speculative_1_vs_standard_1": (runs["speculative_1"], ref),
        "standard_8_vs_standard_1": (runs.get("standard_8"), ref),
        "speculative_8_vs_standard_1": (runs.get("speculative_8"), ref),
        "hf_1_vs_standard_1": (runs["hf_generate_1"], ref),
        "hf_8_vs_hf_1": (runs.get("hf_generate_8"), hf_ref),
    }  # runs at 8 clients: absent from a reduced run
    same = {k: _same(r["outputs"][:one_client], b) for k, (r, b) in pairs.items() if r}
    flat = [t for o in ref for t in o]
    budget = restart["weight_bytes"] + restart["kv_bytes"]
    return {
        "tokens_per_s": {k: v["tokens_per_s"] for k, v in runs.items()},
        "rounds_tokens_per_s": {k: v["rounds_tokens_per_s"] for k, v in runs.items()},
        "acceptance": {k: v["acceptance"] for k, v in runs.items() if v["acceptance"] is not None},
        "identical_outputs": same,
        "output_sample": ref[0][:16],
        "distinct_token_share": round(len(set(flat)) / max(1, len(flat)), 3),
        "memory": {
            "weight_bytes": restart["weight_bytes"], "kv_bytes": restart["kv_bytes"],
            "draft_head_bytes": restart["draft_head_bytes"],
            "rss_ready": restart["rss_ready"]["rss"],
            "rss_draft_loaded": restart["rss_draft_loaded"]["rss"],
            "rss_end": restart["rss_end"]["rss"], "rss_peak": restart["rss_end"]["peak"],
            "rss_over_budget": round(restart["rss_end"]["rss"] / budget, 3),
            "peak_over_budget": round(restart["rss_end"]["peak"] / budget, 3),
            "rss_imports": restart["rss_imports"],
            "first_start_peak": first["rss_draft_loaded"]["peak"],
            "hf_rss_end": hf["rss_end"]["rss"],
            "linear_form": restart["linear_form"], "packs": restart["packs_end"],
        },
        "start": {"first": first, "restart": restart},
        "hf_load_s": hf["load_s"],
        "seconds": {k: v["seconds"] for k, v in runs.items()},
    }  # fmt: skip


def _same(a: list[list[int]], b: list[list[int]]) -> float:
    return round(sum(x == y for x, y in zip(a, b, strict=True)) / max(1, len(b)), 3)


def _goals(cases: dict[str, Any]) -> dict[str, Any]:
    names = ("ready_1.5b_restart_under_60s", "rss_under_1.3x_budget",
             "standard_1_at_least_0.9x_hf", "speculative_1_over_standard_1")  # fmt: skip
    goals: dict[str, Any] = {name: {} for name in names}
    for case, c in cases.items():
        tps = c["tokens_per_s"]
        if case.startswith("qwen2.5-1.5b"):
            ready = c["start"]["restart"]["ready_from_process_start_s"]
            goals["ready_1.5b_restart_under_60s"][case] = {"seconds": ready, "pass": ready < 60}
        ratio = c["memory"]["rss_over_budget"]
        goals["rss_under_1.3x_budget"][case] = {"ratio": ratio, "pass": ratio < 1.3}
        hf = round(tps["standard_1"] / tps["hf_generate_1"], 3)
        goals["standard_1_at_least_0.9x_hf"][case] = {"ratio": hf, "pass": hf >= 0.9}
        spec = round(tps["speculative_1"] / tps["standard_1"], 3)
        goals["speculative_1_over_standard_1"][case] = {"ratio": spec, "pass": spec > 1.0}
    return goals


def _extrapolate(
    cases: dict[str, Any], built: dict[str, Any], start: str = "restart"
) -> dict[str, Any]:
    """Per dtype, each part of the `start`'s (restart or first) ready time fitted as a + b x
    parameters over the shapes measured (a line through two, proportional with one), at a
    7B's parameters."""
    out: dict[str, Any] = {}
    for dtype in sorted({k.split("/")[1] for k in cases}):
        points = [(built[k.split("/")[0]]["parameters"], c["start"][start])
                  for k, c in cases.items() if k.split("/")[1] == dtype]  # fmt: skip
        points.sort(key=lambda p: p[0])
        parts = sorted({p for _, r in points for p in r["target_parts_s"]} | {"imports"})
        est: dict[str, float] = {}
        for part in parts:
            ys = [(n, r["imports_s"] if part == "imports" else r["target_parts_s"].get(part, 0.0))
                  for n, r in points]  # fmt: skip
            if len(ys) == 1 or ys[-1][0] == ys[0][0]:
                n, y = ys[-1]
                est[part] = y if part == "imports" else y * PARAMS_7B / n
            else:
                (n0, y0), (n1, y1) = ys[0], ys[-1]
                slope = max(0.0, (y1 - y0) / (n1 - n0))
                est[part] = y1 + slope * (PARAMS_7B - n1)
        nested = (
            "from_pretrained",
            "tokenizer",
            "family_check",
            "linear_verdict",
            "lean_decoder",
            "lean_parity_check",
        )  # inside load_model
        total = sum(v for k, v in est.items() if k not in nested)
        out[dtype] = {"parts_s": {k: round(v, 1) for k, v in est.items()},
                      "ready_s": round(total, 1), "from": [n for n, _ in points]}  # fmt: skip
    return out


def _machine() -> str:
    from gateway.speed.cpu_linear import machine_identity

    return ", ".join(machine_identity())


def _llamacpp() -> str:
    from benchmarks._llamacpp import HOME

    if shutil.which("llama-server") or (HOME / "build").exists():
        return "a llama.cpp build exists but this benchmark does not drive it yet"
    return (
        "not run: no llama.cpp binary, package or build on this machine (benchmarks/_llamacpp.py "
        "would build one from llama-cpp-python's sources, about 8 minutes on 2 cores)"
    )


def _plot(path: Path, cases: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(cases)
    fig, (tps, ready) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = ("standard_1", "speculative_1", "hf_generate_1", "standard_8", "speculative_8",
              "hf_generate_8")  # fmt: skip
    width = 0.8 / len(series)
    for i, s in enumerate(series):
        xs = [j + i * width for j in range(len(names))]
        tps.bar(xs, [cases[n]["tokens_per_s"].get(s, 0) for n in names], width, label=s)
    tps.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, fontsize=7)
    tps.set(ylabel="tokens/s (all clients)", title="Greedy decoding, engine batch vs HF generate")
    tps.legend(fontsize=7)
    bottom = [0.0] * len(names)
    for part in ("imports", "sha256", "load_model", "cost_probe"):
        vals = [cases[n]["start"]["restart"]["imports_s"] if part == "imports"
                else cases[n]["start"]["restart"]["target_parts_s"].get(part, 0.0)
                for n in names]  # fmt: skip
        ready.bar(range(len(names)), vals, 0.6, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ready.axhline(60, color="k", ls="--", lw=1)
    ready.set_xticks(range(len(names)), names, fontsize=7)
    ready.set(ylabel="seconds", title="Restart: process start to ready (target)")
    ready.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict[str, Any]) -> str:
    lines = ["case | ready (restart) | draft 1st use | RSS / (weights + KV) | std 1 | spec 1 "
             "| HF 1 | std 8 | spec 8 | HF 8 | accept (1) | same as HF"]  # fmt: skip
    for case, c in result["cases"].items():
        t, r, m = c["tokens_per_s"], c["start"]["restart"], c["memory"]
        gib = (m["weight_bytes"] + m["kv_bytes"]) / 2**30
        lines.append(
            f"{case} | {r['ready_from_process_start_s']} s | {r['draft_first_use_s']} s | "
            f"{m['rss_end'] / 2**30:.2f} / {gib:.2f} GiB ({m['rss_over_budget']}x) | "
            f"{t['standard_1']} | {t['speculative_1']} | {t['hf_generate_1']} | "
            f"{t.get('standard_8', '-')} | {t.get('speculative_8', '-')} | "
            f"{t.get('hf_generate_8', '-')} | "
            f"{c['acceptance'].get('speculative_1')} | "
            f"{c['identical_outputs']['hf_1_vs_standard_1']}"
        )
    lines.append(f"goals: {json.dumps(result['goals'])}")
    lines.append(f"7B restart (extrapolated): {json.dumps(result['start_7b_extrapolated'])}")
    first = result.get("first_start_7b_extrapolated")
    lines.append(f"7B first start (extrapolated): {json.dumps(first)}")
    return "\n".join(lines)


def _main(argv: list[str]) -> None:
    kind, args = argv[0], json.loads(argv[1])
    if kind == "build":
        result = build(args["shape"], Path(args["folder"]))
    elif kind == "gateway":
        result = gateway_child(args)
    elif kind == "hf":
        result = hf_child(args)
    else:
        raise SystemExit(f"unknown child {kind!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    _main(sys.argv[1:])
