"""JSON-schema constraint benchmark: what grammar-constrained decoding costs.

    python -m benchmarks [--quick] constraints

Model pair: the demo models of models_registry/demo/manifest.yaml (target demo-code-target
v1, draft demo-code-draft v2); when the manifest is missing, the random-weight stand-ins of
benchmarks/engine.py (speeds then measure overhead only).

Greedy, batch 1, NEW_TOKENS new tokens at most, the prompts below, one JSON schema (strings
of bounded length, a bounded integer, an enum, an array: the notes' measuring schema). For
standard and speculative (draft v2, k in [1, 8]) decoding, constrained (json_schema) and
unconstrained runs are timed, interleaved prompt by prompt; the reported time is the median
over runs (3; --quick: 1 run, 2 prompts, half the tokens). Throughput is tokens per second
of decoding (prefill excluded), because a constrained output ends when its JSON is complete
while an unconstrained one runs on.
Goal: constrained / unconstrained tokens/s >= 0.85 in both modes. With the random stand-ins
the speculative ratio means little: unconstrained, the random draft is never accepted, while
constrained, p and q share the grammar mask and forced tokens (quotes, keys) are accepted.

Tool calls: forced calls (tool_choice "required") standard vs speculative and the
grammar's share of a target step, in `benchmarks/constraints_tools.py`.

Mask time: every call the loop makes to the grammar is timed at the Grammar protocol
boundary (allowed_mask, including cache hits and the bool unpacking; consume; rollback;
is_complete). Reported: allowed_mask mean / p99 per call, llguidance mask computations
(cache misses) mean, and all grammar time per emitted token.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.constraints_tools import run_tools
from gateway.engine import DecodeRequest, DecodeResult, Engine, LoadedModel, SamplingParams
from gateway.engine.constraints.json_schema import (
    ConstraintError,
    JsonGrammar,
    compile_json_grammar,
    validate_output,
)

NEW_TOKENS = 96
K_MIN, K_MAX = 1, 8
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
PROMPTS = [
    "Return the user as JSON.\n",
    'def to_json(user):\n    """Serialise the user record."""\n    return ',
    "# config for the service\nsettings = ",
    "class Person:\n    def __init__(self, name, age):\n",
]


def load_pair() -> tuple[LoadedModel, LoadedModel, str]:
    """(target, draft v2, source): the engine benchmark's pair (random stand-ins if the demo
    models are missing)."""
    from benchmarks._pairs import load_pair as engine_pair

    pair = engine_pair()
    return pair.target, pair.drafts["v2"], pair.source


class TimedGrammar:
    """A Grammar that times every call into the wrapped JsonGrammar."""

    def __init__(self, inner: JsonGrammar, mask_calls: list[float], other: list[float]) -> None:
        self.inner, self._mask_calls, self._other = inner, mask_calls, other

    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        t0 = time.perf_counter()
        mask = self.inner.allowed_mask(vocab_size)
        self._mask_calls.append(time.perf_counter() - t0)
        return mask

    def consume(self, token_id: int) -> None:
        t0 = time.perf_counter()
        self.inner.consume(token_id)
        self._other.append(time.perf_counter() - t0)

    def rollback(self, n: int) -> None:
        t0 = time.perf_counter()
        self.inner.rollback(n)
        self._other.append(time.perf_counter() - t0)

    def is_complete(self) -> bool:
        t0 = time.perf_counter()
        done = self.inner.is_complete()
        self._other.append(time.perf_counter() - t0)
        return done


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else 0.0


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    torch.manual_seed(0)
    target, draft, source = load_pair()
    engine, tok = Engine(target), target.tokenizer
    texts = PROMPTS[:2] if quick else PROMPTS
    prompts = [tuple(tok(p, add_special_tokens=False)["input_ids"]) for p in texts]
    runs = 1 if quick else 3
    new_tokens = NEW_TOKENS // 2 if quick else NEW_TOKENS
    sp = SamplingParams(temperature=0.0, max_tokens=new_tokens)

    t0 = time.perf_counter()
    compiled = compile_json_grammar(tok, SCHEMA, target.vocab_size)
    compile_cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert compile_json_grammar(tok, SCHEMA, target.vocab_size) is compiled
    compile_cached_s = time.perf_counter() - t0

    mask_calls: list[float] = []
    other_calls: list[float] = []
    inners: list[JsonGrammar] = []

    def request(p: tuple[int, ...], mode: str, constrained: bool) -> DecodeRequest:
        grammar = None
        if constrained:
            inners.append(compiled.new())
            grammar = TimedGrammar(inners[-1], mask_calls, other_calls)
        spec = mode == "speculative"
        return DecodeRequest(
            p, sp, mode="speculative" if spec else "standard", proposer="draft" if spec else None,
            k_min=K_MIN, k_max=K_MAX, grammar=grammar,
        )  # fmt: skip

    configs = [(m, c) for m in ("standard", "speculative") for c in (False, True)]
    for mode, constrained in configs:  # warm-up
        engine.run(request(prompts[0], mode, constrained), draft=draft)
    mask_calls.clear()
    other_calls.clear()
    inners.clear()

    # Configs interleaved prompt by prompt, so a drift in machine load hits them alike.
    names = [f"{m}_{'json' if c else 'free'}" for m, c in configs]
    timings: dict[str, list[float]] = {n: [] for n in names}
    results: dict[str, list[DecodeResult]] = {}
    for _ in range(runs):
        secs = dict.fromkeys(names, 0.0)
        results = {n: [] for n in names}
        for p in prompts:
            for name, (mode, constrained) in zip(names, configs, strict=True):
                r = engine.run(request(p, mode, constrained), draft=draft)
                secs[name] += r.stats.draft_s + r.stats.verify_s + r.stats.other_s
                results[name].append(r)
        for name in names:
            timings[name].append(secs[name])

    table: dict[str, Any] = {}
    for name, res in results.items():
        tokens = sum(len(r.token_ids) for r in res)
        median_s = statistics.median(timings[name])
        st = [r.stats for r in res]
        drafted, accepted = sum(s.drafted for s in st), sum(s.accepted for s in st)
        row: dict[str, Any] = {
            "tokens": tokens,
            "decode_seconds_median": round(median_s, 3),
            "tokens_per_s": round(tokens / median_s, 2),
            "stopped": sum(r.finish_reason == "stop" for r in res),
        }
        if drafted:
            row["acceptance_rate"] = round(accepted / drafted, 4)
        if name.endswith("_json"):
            valid = 0
            for r in res:
                try:
                    validate_output(r.text, SCHEMA)
                    valid += r.finish_reason == "stop"
                except ConstraintError:
                    pass
            row["valid_of_stopped"] = f"{valid}/{row['stopped']}"
        table[name] = row

    computed = sum(g.mask_computations for g in inners)
    emitted = sum(len(r.token_ids) for n, rs in results.items() if n.endswith("_json") for r in rs)
    emitted *= runs  # inners span every run; results hold the last one
    ratio = {
        mode: round(
            table[f"{mode}_json"]["tokens_per_s"] / table[f"{mode}_free"]["tokens_per_s"], 3
        )
        for mode in ("standard", "speculative")
    }
    same = all(
        a.token_ids == b.token_ids
        for a, b in zip(results["standard_json"], results["speculative_json"], strict=True)
    )
    return {
        "models": source,
        "device": str(target.device),
        "vocab_size": target.vocab_size,
        "torch_threads": torch.get_num_threads(),
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "runs": runs,
        "compile_cold_ms": round(compile_cold_s * 1000, 2),
        "compile_cached_us": round(compile_cached_s * 1e6, 1),
        "configs": table,
        "constrained_speculative_equals_standard": same,
        "mask": {
            "allowed_mask_calls": len(mask_calls),
            "allowed_mask_mean_us": round(statistics.fmean(mask_calls) * 1e6, 1),
            "allowed_mask_p99_us": round(p99(mask_calls) * 1e6, 1),
            "llguidance_masks_computed": computed,
            "llguidance_mask_mean_us": round(
                sum(g.mask_seconds for g in inners) / max(computed, 1) * 1e6, 1
            ),
            "grammar_us_per_token": round(
                (sum(mask_calls) + sum(other_calls)) / max(emitted, 1) * 1e6, 1
            ),
        },
        "tool_calls": run_tools(target, draft, TimedGrammar, runs, quick),
        "goals": {
            "constrained_over_unconstrained": ratio,
            "met": all(v >= 0.85 for v in ratio.values()),
            "targets": "constrained / unconstrained tokens/s >= 0.85, standard and speculative",
        },
    }
