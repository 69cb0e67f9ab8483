"""What a verify forward costs, by dtype and linear kernel, and what that does to speculation.

    python -m benchmarks [--quick] engine_dtype

The cost model's ideal speedup E / (k c + 1) assumes that one target forward over k + 1
tokens (a verify step) costs the same as a forward over one token (a standard step). This
benchmark measures that assumption on the demo pair, on the device the engine picks (CPU
here), in three variants: fp32 as served (nn.Linear with the weight-major forward of
gateway/speed/cpu_linear.py), fp32_torch_linear (torch's own nn.Linear forward) and bf16.

1. Forward profile: one prefilled context (the first held-out prompt), then target forwards
   over n = 1 .. K_MAX + 1 new tokens, cropped back after each; configurations interleaved
   in random order (variants and n alike), median over repetitions.
   `cost_by_tokens[n - 1]` = t(n) / t(1). `verify_cost` (decoding) is relative to each
   variant's own standard step.
2. Decoding: the held-out prompts, greedy, 128 new tokens, standard and spec_v2 (draft v2
   with its reduced head, adaptive k) in each variant, interleaved per prompt; speedups are
   paired medians over runs. Each variant's speculative row is compared with the standard
   row of the SAME variant (speedup, same_output_as_standard, measured/ideal).
   `weight_major_linear` compares fp32 with fp32_torch_linear (time ratios, paired medians;
   equal outputs), `bf16_standard_outputs_equal_to_fp32` counts the prompts whose bf16
   standard output is fp32's.

Greedy speculative output equals standard output exactly in exact arithmetic. In floating
point a forward over k + 1 tokens rounds differently from k + 1 forwards over one token each
(other kernel blocking, other summation order), so when the target's two best logits are
closer than that rounding, greedy can pick the other one. In fp32 the rounding is ~1e-7
relative; in bf16 ~4e-3, and `first_divergence` shows where it happens on real prompts.
`tie_gaps` gives, at each such point, logprob(standard's token) - logprob(speculative's
token) in the standard run's own distribution (a re-run with top-5 logprobs; None when the
speculative token is not among the top 5): a gap of a few ulps or less is a rounding tie.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from benchmarks import engine as eb
from benchmarks.engine_heldout import PROMPTS
from gateway.engine import DecodeRequest, Engine, LoadedModel, SamplingParams
from gateway.engine.models import cache_kwarg, crop_cache, forward_logits

# variant -> (dtype, cpu_linear): fp32 as served, fp32 with torch's own nn.Linear forward
# (what gateway/speed/cpu_linear.py replaces), bf16.
DTYPES = {
    "fp32": (torch.float32, True),
    "fp32_torch_linear": (torch.float32, False),
    "bf16": (torch.bfloat16, True),
}


def forward_profile(
    targets: dict[str, LoadedModel], context: list[int], reps: int
) -> dict[str, list[float]]:
    """Per target: median seconds of one cached forward over n = 1 .. K_MAX + 1 tokens.
    Every (target, n) pair is timed once per repetition, in a fresh random order."""
    kwargs = {name: cache_kwarg(t.model) for name, t in targets.items()}  # outside the timing
    caches: dict[str, tuple[DynamicCache, int]] = {}
    with torch.inference_mode():
        for name, t in targets.items():
            cache = DynamicCache()
            forward_logits(t.model, kwargs[name], context, cache, t.device, 1)
            caches[name] = (cache, cache.get_seq_length())
    jobs = [(name, n) for name in targets for n in range(1, eb.K_MAX + 2)]
    times: dict[tuple[str, int], list[float]] = {job: [] for job in jobs}
    rng = random.Random(0)
    with torch.inference_mode():
        for _ in range(reps):
            rng.shuffle(jobs)
            for name, n in jobs:
                t, (cache, length) = targets[name], caches[name]
                t0 = time.perf_counter()
                forward_logits(t.model, kwargs[name], context[:n], cache, t.device, 0)
                times[(name, n)].append(time.perf_counter() - t0)
                crop_cache(cache, length)
    return {
        name: [statistics.median(times[(name, n)]) for n in range(1, eb.K_MAX + 2)]
        for name in targets
    }


def first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """Index of the first token where two outputs differ (None when equal)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))  # fmt: skip


def tie_gap(eng: Engine, prompt: tuple[int, ...], spec: tuple[int, ...], j: int) -> float | None:
    """In the standard run's distribution at token j: logprob(its token) - logprob(spec's)."""
    sp = SamplingParams(temperature=0.0, max_tokens=eb.NEW_TOKENS, logprobs=True, top_logprobs=5)
    std = eng.run(DecodeRequest(prompt, sp))
    if j >= min(len(std.token_ids), len(spec)):
        return None
    top = {tid: lp for tid, _, lp in std.logprobs[j].top}
    a, b = std.token_ids[j], spec[j]
    return round(top[a] - top[b], 5) if a in top and b in top else None


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    torch.manual_seed(0)
    pairs = {name: eb.load_pair(dtype, lin) for name, (dtype, lin) in DTYPES.items()}
    prompts = eb.load_prompts(pairs["fp32"].target.tokenizer, PROMPTS)
    runs, reps = (1, 8) if quick else (3, 25)
    sp = SamplingParams(temperature=0.0, max_tokens=eb.NEW_TOKENS)

    def spec(p: tuple[int, ...]) -> DecodeRequest:
        return DecodeRequest(p, sp, mode="speculative", proposer="draft", k_min=eb.K_MIN,
                             k_max=eb.K_MAX)  # fmt: skip

    # 1. Forward profile (after one warm-up decode per dtype).
    engines = {name: Engine(pair.target) for name, pair in pairs.items()}
    for name, pair in pairs.items():
        engines[name].run(DecodeRequest(prompts[0], sp))
        engines[name].run(spec(prompts[0]), draft=pair.drafts["v2"])
    profile = forward_profile({n: p.target for n, p in pairs.items()}, list(prompts[0]), reps)

    # 2. Decoding, interleaved per prompt.
    names = [f"{kind}_{d}" for d in DTYPES for kind in ("standard", "spec_v2")]
    configs = {n: eb.ConfigRun() for n in names}
    for _ in range(runs):
        secs = dict.fromkeys(names, 0.0)
        results: dict[str, list[Any]] = {n: [] for n in names}
        for p in prompts:
            for d, pair in pairs.items():
                for kind, req, draft in (("standard", DecodeRequest(p, sp), None),
                                         ("spec_v2", spec(p), pair.drafts["v2"])):  # fmt: skip
                    dt, res = eb.time_engine(engines[d], req, draft)
                    secs[f"{kind}_{d}"] += dt
                    results[f"{kind}_{d}"].append(res)
        for n in names:
            configs[n].seconds.append(secs[n])
            configs[n].results = results[n]
            configs[n].outputs = [r.token_ids for r in results[n]]

    table: dict[str, Any] = {}
    for d in DTYPES:
        base = configs[f"standard_{d}"]
        t_step = eb.standard_step(base.results)
        steps = profile[d]
        spec_outs = configs[f"spec_v2_{d}"].outputs
        parts = [first_divergence(a, b) for a, b in zip(base.outputs, spec_outs, strict=True)]
        table[d] = {
            "standard_step_ms": round(t_step * 1000, 3),
            "forward_ms_by_tokens": [round(t * 1000, 3) for t in steps],
            "cost_by_tokens": [round(t / steps[0], 3) for t in steps],
            "standard": eb.summarise("standard", base, base, t_step),
            "spec_v2": eb.summarise("spec_v2", configs[f"spec_v2_{d}"], base, t_step),
            "first_divergence": parts,
            "tie_gaps": [
                None if j is None else tie_gap(engines[d], p, out, j)
                for p, out, j in zip(prompts, spec_outs, parts, strict=True)
            ],
        }
    fp32_std, bf16_std = configs["standard_fp32"].outputs, configs["standard_bf16"].outputs
    same_as_fp32 = sum(a == b for a, b in zip(fp32_std, bf16_std, strict=True))

    def time_ratio(kind: str) -> float:  # weight-major / torch linear, paired over runs
        new, old = configs[f"{kind}_fp32"].seconds, configs[f"{kind}_fp32_torch_linear"].seconds
        return round(statistics.median(a / b for a, b in zip(new, old, strict=True)), 3)

    torch_std = configs["standard_fp32_torch_linear"].outputs
    weight_major = {
        "standard_time_ratio": time_ratio("standard"),
        "spec_v2_time_ratio": time_ratio("spec_v2"),
        "standard_outputs_equal": sum(a == b for a, b in zip(fp32_std, torch_std, strict=True)),
    }
    return {
        "models": pairs["fp32"].source,
        "device": str(pairs["fp32"].target.device),
        "torch_threads": torch.get_num_threads(),
        "prompt_set": str(PROMPTS.relative_to(PROMPTS.parents[2])),
        "prompts": len(prompts),
        "new_tokens": eb.NEW_TOKENS,
        "runs": runs,
        "forward_reps": reps,
        "dtypes": table,
        "weight_major_linear": weight_major,
        "bf16_standard_outputs_equal_to_fp32": same_as_fp32,
        "notes": "cost_by_tokens[n-1] = one target forward over n new tokens / over 1 token; "
        "each variant's spec_v2 row is relative to the standard row of the same variant",
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"device: {result['device']}  prompts: {result['prompts']}  runs: {result['runs']}"]
    for d, row in result["dtypes"].items():
        spec = row["spec_v2"]
        same = sum(x is None for x in row["first_divergence"])
        lines.append(
            f"{d}: step {row['standard_step_ms']} ms  cost by tokens {row['cost_by_tokens']}\n"
            f"      spec_v2 {spec['speedup']}x  verify_cost {spec.get('verify_cost')}  "
            f"meas/ideal {spec.get('measured_over_ideal')}  same output {same}/{result['prompts']}"
            f"  first divergence {row['first_divergence']}  tie gaps {row['tie_gaps']}"
        )
    lines.append(f"weight-major vs torch linear (fp32): {result['weight_major_linear']}")
    lines.append(f"bf16 standard == fp32 standard: {result['bf16_standard_outputs_equal_to_fp32']}"
                 f"/{result['prompts']}")  # fmt: skip
    return "\n".join(lines)
