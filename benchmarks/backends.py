"""The llama.cpp backend beside the torch backend, in the engine (no HTTP, no audit).

    python -m benchmarks backends

The demo pair (target v1, draft v2) as GGUF (models_registry/gguf.py, through
benchmarks/_llamacpp.py `gguf`: var/llamacpp/gguf/), and as the torch models the gateway
loads today (eager: no compiled step). The 16 code prompts (benchmarks/prompts), 64 greedy
tokens each, served through `Engine.batch` with 1 and 8 rows in flight (a finished row's
place taken by the next prompt), standard and speculative (draft v2, k 1..8, the k policy
on measured costs as in the gateway). BACKENDS=llama.cpp (or torch) runs one of them; GGUF
(default f32; e.g. f32,q8_0,q4_k_m) the llama.cpp pair's quantizations, each run on its
own; THREADS (default 2) sets both backends' threads. On a CPU shared with other work,
llama.cpp's threads wait on each other at every barrier: a one-token forward then costs
many times more with two threads than with one (THREADS=1 measures the kernels).

Reported per backend, mode and rows: aggregate tokens/s, and for llama.cpp the exactness
measured on it: speculative outputs equal to standard (token for token), 8 rows equal to
1 row; where two outputs part, the logit gap between the two tokens there (one fresh
forward over the common context). Needs the `llamacpp` extra (llama-cpp-python, gguf).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks._llamacpp import DEMO, MODELS, gguf
from gateway.engine import DecodeRequest, DecodeResult, Engine, LoadedModel, SamplingParams
from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.schema import Finished
from gateway.speed import load_fast

HERE = Path(__file__).resolve().parent
NEW_TOKENS = 64
THREADS = int(os.environ.get("THREADS", "2"))  # llama.cpp and torch threads
ROWS = (1, 8)


def _prompts(tokenizer: Any) -> list[tuple[int, ...]]:
    texts = []
    for name in ("code.jsonl", "heldout.jsonl"):
        lines = (HERE / "prompts" / name).read_text().splitlines()
        texts += [json.loads(x)["prompt"] for x in lines if x.strip()]
    return [tuple(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _request(prompt: tuple[int, ...], mode: str) -> DecodeRequest:
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    if mode == "standard":
        return DecodeRequest(prompt, sp)
    return DecodeRequest(prompt, sp, mode="speculative", proposer="draft", k_min=1, k_max=8)


def serve(
    engine: Engine, reqs: list[DecodeRequest], rows: int, draft: LoadedModel | None
) -> tuple[list[DecodeResult], float]:
    """Every request through one batch of `rows` rows, kept full: (results, seconds)."""
    batch = engine.batch(rows)
    pending = list(enumerate(reqs))
    live: dict[int, int] = {}
    out: dict[int, DecodeResult] = {}
    t0 = time.perf_counter()
    while pending or live:
        while pending and batch.free > 0:
            i, req = pending.pop(0)
            live[id(batch.add(engine.prepare(req, draft)))] = i
        for row, events in batch.step():
            for e in events:
                if isinstance(e, Exception):
                    raise e
                if isinstance(e, Finished):
                    out[live.pop(id(row))] = e.result
    return [out[i] for i in range(len(reqs))], time.perf_counter() - t0


def _gap(lm: LoadedModel, prompt: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]):
    """Where a and b part: {index, gap between the two tokens' logits}; None if they agree."""
    i = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if i is None:
        return None
    from gateway.engine.backends.base import slot_cache

    cache = slot_cache(lm.model, 1, lm.context_length)
    ctx = [*prompt, *a[:i]]
    z = batched_forward(lm.model, Step(cache, [cache.take()], [ctx], keep_last=True))[0][0]
    return {"index": i, "gap": abs(float(z[a[i]] - z[b[i]]))}


def _compare(lm: LoadedModel, prompts, got: list[DecodeResult], want: list[DecodeResult]):
    parts = [
        _gap(lm, p, g.token_ids, w.token_ids) for p, g, w in zip(prompts, got, want, strict=True)
    ]
    found = [p for p in parts if p is not None]
    return {
        "equal": len(parts) - len(found),
        "of": len(parts),
        "partings": found,
        "max_gap": max((p["gap"] for p in found), default=None),
    }


def _pair(backend: str, kind: str = "f32") -> tuple[LoadedModel, LoadedModel]:
    if backend == "torch":
        return (
            load_fast(DEMO / MODELS["target"], device="cpu"),
            load_fast(DEMO / MODELS["draft_v2"], device="cpu"),
        )
    from gateway.engine.backends.llamacpp import load_gguf

    return (
        load_gguf(gguf("target", kind), DEMO / MODELS["target"], threads=THREADS),
        load_gguf(gguf("draft_v2", kind), DEMO / MODELS["draft_v2"], threads=THREADS),
    )


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(THREADS)
    report: dict[str, Any] = {"new_tokens": NEW_TOKENS, "threads": THREADS, "runs": {}}
    sides = []  # (backend, quantization, label)
    for backend in os.environ.get("BACKENDS", "llama.cpp,torch").split(","):
        kinds = os.environ.get("GGUF", "f32").split(",") if backend == "llama.cpp" else [""]
        sides += [(backend, k, f"{backend}-{k}" if k and k != "f32" else backend) for k in kinds]
    for backend, kind, label in sides:
        target, draft = _pair(backend, kind or "f32")
        engine = Engine(target)
        engine.measure_costs(max(ROWS))
        engine.measure_costs(max(ROWS), draft)
        prompts = _prompts(target.tokenizer)
        if quick:
            prompts = prompts[:4]
        results: dict[tuple[str, int], list[DecodeResult]] = {}
        for mode in ("standard", "speculative"):
            for rows in ROWS:
                reqs = [_request(p, mode) for p in prompts]
                serve(engine, reqs[:1], 1, draft if mode != "standard" else None)  # warm-up
                got, spent = serve(engine, reqs, rows, draft if mode != "standard" else None)
                results[(mode, rows)] = got
                tokens = sum(len(r.token_ids) for r in got)
                accepted = [r.stats.accepted / r.stats.drafted for r in got if r.stats.drafted]
                report["runs"][f"{label}/{mode}/{rows}"] = run_ = {
                    "tokens_per_s": tokens / spent,
                    "tokens": tokens,
                    "seconds": spent,
                    "acceptance": statistics.mean(accepted) if accepted else None,
                }
                print(f"   {label}/{mode}/{rows}: {run_}", flush=True)
        if backend == "llama.cpp":
            std1 = results[("standard", 1)]
            exact = report.setdefault("exactness", {})
            for mode, rows in [("speculative", 1), ("standard", 8), ("speculative", 8)]:
                name = f"{label}: {mode}/{rows} vs standard/1"
                exact[name] = _compare(target, prompts, results[(mode, rows)], std1)
            if label == "llama.cpp":  # f32: compared with torch's texts below
                report["llama.cpp_texts"] = [r.token_ids for r in std1]
            print(f"   exactness: {json.dumps(exact)}", flush=True)
        elif "llama.cpp_texts" in report:
            cpp = report.pop("llama.cpp_texts")
            same = sum(a == r.token_ids for a, r in zip(cpp, results[("standard", 1)], strict=True))
            report["llama.cpp_vs_torch_standard_equal"] = f"{same}/{len(cpp)}"
        del engine, target, draft
    report.pop("llama.cpp_texts", None)
    return report


def table(result: dict[str, Any]) -> str:
    lines = [f"{'backend/mode/rows':32} {'tokens/s':>9} {'acceptance':>10}"]
    for name, r in result["runs"].items():
        acc = "" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        lines.append(f"{name:32} {r['tokens_per_s']:9.1f} {acc:>10}")
    for name, e in result.get("exactness", {}).items():
        gap = "" if e["max_gap"] is None else f" (largest gap at a parting {e['max_gap']:.2e})"
        lines.append(f"{name}: {e['equal']}/{e['of']} equal{gap}")
    if "llama.cpp_vs_torch_standard_equal" in result:
        lines.append(f"llama.cpp vs torch, standard: {result['llama.cpp_vs_torch_standard_equal']}")
    return "\n".join(lines)
