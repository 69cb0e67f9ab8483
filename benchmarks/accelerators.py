"""What each accelerator of the speed package (gateway/speed) buys, step by step, and what
it costs to start: the evidence of the decision records in docs/decisions/.

    python -m benchmarks accelerators [--quick]

On two models: the demo target (12M parameters) and a model of realistic shape (Qwen2.5
0.5B's layer and vocabulary shapes, random weights, 4 of its 24 layers: a step's cost per
layer is what the accelerators change). For each, the same batch steps (1 and 8 rows, 1
and 5 tokens a row: decode and verify steps, 128 tokens of context a row) are timed under
each form, round-robin so that load drifts hit every form alike (median of the rounds):

- eager: the core engine alone (the model's own forward, torch's linear layers);
- lean: the lean decoder (speed/lean.py);
- lean + weight-major: and the weight-major CPU linear form (speed/cpu_linear.py);
- compiled: the compiled steps (speed/compiled.py) over the lean decoder, with the C++
  kernel of the packed products where it builds (speed/native.py);
- compiled, Python kernel: the same with the products' Python kernel (a subprocess
  without a C++ compiler), for the C++ kernel's record.

Start-up: the seconds each form adds to a load (the lean decoder's parity check, the
linear verdict's timing, a cold compile of every kind of step). Code: the lines of each
accelerator's modules. Outputs are compared too: each form's greedy next tokens on the
timed steps against eager's (the compiled forms may part at near ties; counted).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.batch.slots import SlotCache, slot_pad
from gateway.engine.models import LoadedModel, wrap_model
from gateway.speed import accelerate
from gateway.speed.warmup import CompileOptions, compiled_model

ROOT = Path(__file__).resolve().parent.parent
SPEED = ROOT / "gateway" / "speed"
CONTEXT = 128
SHAPES = [(1, 1), (8, 1), (1, 5), (8, 5)]  # (rows, tokens a row)
ROWS = 8
CODE = {
    "lean": ["lean.py"],
    "weight_major": ["cpu_linear.py", "packed_linear.py"],
    "native_kernel": ["native.py", "linear_rows.cpp"],
    "compiled": ["compiled.py", "kinds.py", "steps.py", "store.py", "warmup.py", "fast.py"],
    "cuda_graphs": ["graphs.py"],
}


DEMO = ROOT / "models_registry" / "demo" / "demo-code-target-v1"


def _demo() -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(DEMO), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(DEMO), local_files_only=True)
    return wrap_model(model.requires_grad_(False), tok, str(DEMO))


def _realistic() -> LoadedModel:
    """Qwen2.5-0.5B's shapes (hidden 896, 14 heads of 64, 2 KV heads, MLP 4864, vocabulary
    151936, tied head), 4 layers, random weights; the demo tokenizer stands in (the steps
    feed ids below its vocabulary)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=4,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=True, rope_theta=1e6,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg).eval().requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(str(DEMO), local_files_only=True)
    return wrap_model(model, tok, "qwen2.5-0.5b-shape-4-layers")


def _forms(build: Any, compile_too: bool) -> tuple[dict[str, LoadedModel], dict[str, float]]:
    """Each form of a fresh copy of the model, and the seconds each took to make."""
    forms: dict[str, LoadedModel] = {}
    start: dict[str, float] = {}
    forms["eager"] = build()
    t0 = time.perf_counter()
    forms["lean"] = accelerate(build(), cpu_linear=False)
    start["lean"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    forms["lean_weight_major"] = accelerate(build(), cpu_linear=True)
    start["lean_weight_major"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    accelerate(build(), cpu_linear=None)  # the verdict's timing (auto)
    start["linear_verdict_auto"] = time.perf_counter() - t0
    if compile_too:
        lm = accelerate(build(), cpu_linear=False, compiled=True)
        with tempfile.TemporaryDirectory() as store:
            t0 = time.perf_counter()
            forms["compiled"], _ = compiled_model(
                lm, ROWS, options=CompileOptions(store=Path(store))
            )
            start["compiled_cold"] = time.perf_counter() - t0
            lm2 = accelerate(build(), cpu_linear=False, compiled=True)
            t0 = time.perf_counter()
            compiled_model(lm2, ROWS, options=CompileOptions(store=Path(store)))
            start["compiled_from_store"] = time.perf_counter() - t0
    return forms, start


def _time_steps(forms: dict[str, LoadedModel], rounds: int) -> dict[str, Any]:
    """Median seconds of each step shape under each form (round-robin), and how many
    greedy next tokens of each form part from eager's."""
    caches: dict[str, SlotCache] = {}
    slots: dict[str, list[int]] = {}
    gen = torch.Generator().manual_seed(1)
    any_lm = next(iter(forms.values()))
    vocab = min(any_lm.vocab_size, 8000)
    fill = [torch.randint(1, vocab, (CONTEXT,), generator=gen).tolist() for _ in range(ROWS)]
    feeds = {s: [torch.randint(1, vocab, (s[1],), generator=gen).tolist() for _ in range(s[0])]
             for s in SHAPES}  # fmt: skip
    with torch.inference_mode():
        for name, lm in forms.items():
            layers = int(lm.model.config.num_hidden_layers)
            cache = None if lm.fast is None else lm.fast.slot_cache(layers, lm.context_length)
            if cache is None:
                cache = SlotCache(layers, ROWS, lm.context_length, pad=slot_pad())
            caches[name] = cache
            slots[name] = [cache.take() for _ in range(ROWS)]
            for s, ids in zip(slots[name], fill, strict=True):
                batched_forward(lm.model, Step(cache, [s], [ids], keep_last=True), lm.fast)
                cache.length[s] = CONTEXT
        times: dict[str, dict[str, list[float]]] = {n: {} for n in forms}
        tokens: dict[str, dict[str, list[int]]] = {n: {} for n in forms}
        for r in range(rounds + 1):  # the first round warms up
            for shape in SHAPES:
                key = f"{shape[0]}x{shape[1]}"
                for name, lm in forms.items():
                    step = Step(caches[name], slots[name][: shape[0]], feeds[shape])
                    t0 = time.perf_counter()
                    out = batched_forward(lm.model, step, lm.fast)
                    spent = time.perf_counter() - t0
                    if r:
                        times[name].setdefault(key, []).append(spent)
                    else:
                        tokens[name][key] = [int(t) for o in out for t in o.argmax(-1)]
    medians = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in times.items()}
    parted = {
        n: sum(a != b for k in tokens["eager"] for a, b in
               zip(tokens["eager"][k], tokens[n][k], strict=True))
        for n in forms
    }  # fmt: skip
    return {"seconds": medians, "tokens_parted_from_eager": parted}


def _one(which: str, rounds: int, compile_too: bool) -> dict[str, Any]:
    build = _demo if which == "demo" else _realistic
    forms, start = _forms(build, compile_too)
    timed = _time_steps(forms, rounds)
    eager = timed["seconds"]["eager"]
    speedup = {
        n: {k: round(eager[k] / v, 3) for k, v in d.items()} for n, d in timed["seconds"].items()
    }
    return {"start_seconds": start, **timed, "speedup_over_eager": speedup}


def _python_kernel(which: str, rounds: int) -> dict[str, Any]:
    """The compiled form with the Python kernel of the packed products: a subprocess in
    which the C++ kernel cannot build (a fresh extensions folder, and a compiler that
    refuses linear_rows.cpp and compiles everything else: inductor's kernels need one)."""
    with tempfile.TemporaryDirectory() as ext:
        gxx = Path(ext) / "bin" / "g++"
        gxx.parent.mkdir()
        gxx.write_text('#!/bin/sh\ncase "$*" in *linear_rows*) exit 1;; esac\nexec g++ "$@"\n')
        gxx.chmod(0o755)
        env = {**os.environ, "CXX": str(gxx), "TORCH_EXTENSIONS_DIR": ext,
               "ACCELERATORS_CHILD": f"{which}:{rounds}"}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.accelerators"], env=env, capture_output=True,
            text=True, cwd=ROOT, check=True,
        )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _code_lines() -> dict[str, int]:
    return {
        name: sum(len((SPEED / f).read_text().splitlines()) for f in files)
        for name, files in CODE.items()
    }


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    from gateway.speed import packed_linear

    rounds = 5 if quick else 15
    result: dict[str, Any] = {
        "machine": {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "native_kernel": packed_linear.NATIVE},
        "rounds": rounds, "context": CONTEXT, "code_lines": _code_lines(),
    }  # fmt: skip
    for which in ("demo", "realistic_shape"):
        result[which] = _one(which, rounds, compile_too=True)
        child = _python_kernel(which, rounds)
        mine = result[which]["seconds"]["compiled"]
        result[which]["compiled_python_kernel"] = {
            "seconds": child["seconds"],
            "cxx_over_python_time": {k: round(mine[k] / v, 3) for k, v in child["seconds"].items()},
        }
    return result


def table(result: dict[str, Any]) -> str:
    lines = []
    for which in ("demo", "realistic_shape"):
        lines.append(f"{which}: speedup over eager by step (rows x tokens)")
        for form, d in result[which]["speedup_over_eager"].items():
            lines.append(f"  {form:<20}" + "  ".join(f"{k} {v:.2f}x" for k, v in d.items()))
        lines.append("  start seconds: " + ", ".join(
            f"{k} {v:.1f}" for k, v in result[which]["start_seconds"].items()))  # fmt: skip
        c = result[which]["compiled_python_kernel"]["cxx_over_python_time"]
        lines.append(
            "  compiled, C++/Python kernel time: " + ", ".join(f"{k} {v:.2f}" for k, v in c.items())
        )
    return "\n".join(lines)


def _child() -> None:
    which, rounds = os.environ["ACCELERATORS_CHILD"].split(":")
    from gateway.speed import packed_linear

    assert not packed_linear.NATIVE, "the C++ kernel loaded in the Python-kernel run"
    build = _demo if which == "demo" else _realistic
    lm = accelerate(build(), cpu_linear=False, compiled=True)
    with tempfile.TemporaryDirectory() as store:
        fast, _ = compiled_model(lm, ROWS, options=CompileOptions(store=Path(store)))
        timed = _time_steps({"eager": build(), "compiled": fast}, int(rounds))
    print(json.dumps({"seconds": timed["seconds"]["compiled"]}))


if __name__ == "__main__":
    _child()
