"""The batch path on a CUDA GPU: eager against captured CUDA graphs (speed/graphs.py), with
the eager lean step and with the inductor-compiled step inside them; and what a user would
otherwise run in-process, transformers' generate (standard, and assisted by the same draft).

    python -m benchmarks engine_cuda [--quick]      (needs a CUDA device)

Demo pair in the engine's default dtype on CUDA (bf16), held-out code prompts, greedy, one
process: every row joins at step 0, tokens/s = generated tokens / wall time of the batch;
the sides alternate round by round and the median is kept. `identical_rows` compares each
side's outputs with eager's token for token (bf16: a padded product may round otherwise
and part at a near tie; tests/unit/speed/test_graphs.py checks fp32). transformers'
generate runs the prompts one after another (it has no continuous batching), assisted with
a constant k = 4 like http_assisted.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

K = 4


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise RuntimeError("needs a CUDA device (the committed report is from a GPU run)")
    from benchmarks._pairs import load_pair
    from benchmarks.concurrency import _prompts
    from gateway.engine import DecodeRequest, Engine, Finished, SamplingParams
    from gateway.speed.fast import compiled_of
    from gateway.speed.warmup import CompileOptions, compiled_model

    rounds, new = (1, 32) if quick else (3, 64)
    pair = load_pair()
    target, draft = pair.target, pair.drafts["v2"]
    warm: dict[str, float] = {}
    sides: dict[str, tuple[Engine, Any]] = {"eager": (Engine(target), draft)}
    for name, inductor in (("graphs", False), ("graphs_inductor", True)):
        t0 = time.perf_counter()
        fast_t, _ = compiled_model(
            target, 8, options=CompileOptions(inductor=inductor, graphs=True), progress=print
        )
        fast_d, _ = compiled_model(
            draft,
            8,
            draft=True,
            options=CompileOptions(inductor=inductor, graphs=True),
            progress=print,
        )
        warm[name] = round(time.perf_counter() - t0, 1)
        sides[name] = (Engine(fast_t), fast_d)
    tok = sides["eager"][0].tokenizer
    ids = [tuple(tok(p)["input_ids"]) for p in _prompts()]
    batches = {name: eng.batch(8) for name, (eng, _) in sides.items()}

    def go(name: str, mode: str, rows: int) -> tuple[float, list[list[int]]]:
        eng, d = sides[name]
        batch = batches[name]
        sp = SamplingParams(temperature=0.0, max_tokens=new)
        kw: dict[str, Any] = {} if mode == "standard" else {
            "mode": "speculative", "proposer": "draft", "k_min": 1, "k_max": 8}  # fmt: skip
        got: dict[int, list[int]] = {}
        for i in range(rows):
            req = DecodeRequest(ids[i % len(ids)], sp, **kw)
            got[id(batch.add(eng.prepare(req, d if mode != "standard" else None)))] = []
        order = list(got)
        torch.cuda.synchronize()
        t = time.perf_counter()
        while batch.rows:
            for row, events in batch.step():
                for e in events:
                    if isinstance(e, Finished):
                        got[id(row)] = list(e.result.token_ids)
        torch.cuda.synchronize()
        toks = [got[k] for k in order]
        return sum(len(x) for x in toks) / (time.perf_counter() - t), toks

    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": str(target.dtype),
        "setup": {"rows": [1, 8], "new_tokens": new, "rounds": rounds, "draft": "v2"},
        "warmup_s": warm,
    }
    for mode in ("standard", "speculative"):
        for rows in (1, 8):
            speeds: dict[str, list[float]] = {name: [] for name in sides}
            outputs: dict[str, list[list[int]]] = {}
            for name in sides:
                go(name, mode, rows)  # untimed: the first captures of these buckets
            for r in range(rounds):
                for name in sides if r % 2 == 0 else reversed(list(sides)):
                    speed, outputs[name] = go(name, mode, rows)
                    speeds[name].append(speed)
            cell: dict[str, Any] = {}
            for name in sides:
                cell[f"{name}_tok_s"] = round(statistics.median(speeds[name]), 1)
                same = sum(a == b for a, b in zip(outputs[name], outputs["eager"], strict=True))
                cell[f"{name}_identical_rows"] = f"{same}/{rows}"
            for name in sides:
                if name != "eager":
                    cell[f"{name}_over_eager"] = round(
                        cell[f"{name}_tok_s"] / cell["eager_tok_s"], 2
                    )
            out[f"{mode}_{rows}"] = cell
            print(mode, rows, cell, flush=True)
    out["captures"] = {
        name: {
            "graphs": sum(compiled_of(m).graphs.captures for m in (e.target, d)),
            "seconds": round(sum(compiled_of(m).graphs.capture_s for m in (e.target, d)), 2),
        }
        for name, (e, d) in sides.items()
        if name != "eager"
    }
    out["hf_generate"] = _hf(pair, ids[: 4 if quick else 8], new)
    best = max(out["standard_1"][f"{n}_tok_s"] for n in sides)
    spec = max(out["speculative_1"][f"{n}_tok_s"] for n in sides)
    out["ratios"] = {
        "best_standard_1_over_hf_standard": round(best / out["hf_generate"]["standard_tok_s"], 2),
        "best_speculative_1_over_hf_assisted": round(
            spec / out["hf_generate"]["assisted_tok_s"], 2
        ),
    }
    return out


def _hf(pair: Any, prompts: list[tuple[int, ...]], new: int) -> dict[str, float]:
    """transformers' generate, one prompt after another: standard and assisted (k = 4)."""
    target, draft = pair.target.model, pair.drafts["v2_full_head"].model
    eos = target.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    out: dict[str, float] = {}
    for name, extra in (("standard", {}), ("assisted", {"assistant_model": draft})):
        if extra:
            gc = draft.generation_config
            gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = K, "constant"
            gc.assistant_confidence_threshold = 0.0
        made, spent = 0, 0.0
        for i, p in enumerate([prompts[0], *prompts]):  # the first: untimed
            x = torch.tensor([p], device=target.device)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.inference_mode():
                y = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                                    do_sample=False, pad_token_id=eos, **extra)  # fmt: skip
            torch.cuda.synchronize()
            if i:
                made += y.shape[1] - x.shape[1]
                spent += time.perf_counter() - t0
        out[f"{name}_tok_s"] = round(made / spent, 1)
    return out
