"""fp32 linear layers for decode-sized inputs on CPU: y^T = W x^T instead of y = x W^T.

A decode step feeds 1 token and a verify step k + 1, so every nn.Linear multiplies a few
rows by a large weight. torch computes x @ W^T; on the CPU we measured (MKL, AMD EPYC, 2
cores) that call grows with the row count much faster than W @ x^T does (our reading: MKL
packs the large operand on every call in the first form, the small one in the second). A
single row is doubled, because MKL's one-column kernel is slower than its two-column one
(by `torch.cat`: `repeat` took 27 us against 4 on an AVX2 EPYC, and the whole standard
step 12% longer).
Same fp32 arithmetic, other summation blocking: results differ from x @ W^T by rounding
(~1e-7 relative), in standard and speculative decoding alike. Inputs with more than
ROWS_MAX rows (long prefills), autograd, and weights no longer fp32 on CPU keep torch's own
path. The output is laid out as F.linear's (contiguous), so downstream kernels (attention)
are the ones torch would pick.
`benchmarks/engine_dtype.py` measures both forwards side by side.

From packed_linear.ROWS_MIN rows on (a verify step of k >= 3, a batch's step, a prefill
chunk), the product runs on oneDNN with the weight packed once instead (packed_linear.py:
up to 2x cheaper at 8-40 rows, and a row rounds the same alone and among up to 128).

Traced by torch.compile (engine/compiled.py), one row is multiplied by W and summed along
the input instead (a reduction inductor generates and fuses, with no library call and no
doubling), output head included; several rows call the product above as the op
`gateway::linear_rows`, which picks its form by the rows at run time, so a compiled kind
(1 x several tokens, several rows) stays one graph for every row count. On the AVX2 EPYC the demo
target's compiled one-row decode step went from 12.6 to 11.1 ms (standard decoding,
in-process, one run each); torch's own linear there (inductor's decompose_mm_pass takes
one-row products, but not the 8192 x 256 head) gave 12.2 ms.

Whether it pays depends on the CPU and its BLAS: on the AMD EPYC machines it was written
on, verify steps got 20-30% cheaper; on an Intel Xeon with AMX (MKL) the same demo pair
decoded 2x slower with it (standard 67-70 vs 128-153 tokens/s). So `load_model` measures
by default (`weight_major_pays`): the model's own forward, a decode and a verify step, in
both forms, once per process and model shape, and patches only where it is faster.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import statistics
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gateway.engine import packed_linear

ROWS_MAX = 128  # above the largest verify (engine.MAX_K + 1 rows): every decode step and
# every verify step take this path, so both modes round alike; longer prefills keep torch's


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, w, b), computed as W @ x^T when that is the faster form (see above)."""
    rows = x.numel() // x.shape[-1]
    if rows > ROWS_MAX or torch.is_grad_enabled() or w.dtype != torch.float32 or w.is_cuda:
        return F.linear(x, w, b)
    x2 = x.reshape(rows, x.shape[-1])  # (rows, in)
    if rows == 1 and torch.compiler.is_compiling():
        y = (x2 * w).sum(-1)[None]  # (1, out): a generated reduction (see above)
    elif torch.compiler.is_compiling():
        y = torch.ops.gateway.linear_rows(x2, w)  # (rows, out): an extern kernel (see above)
    else:
        y = packed_linear.product(x2, w)  # (rows, out)
    if b is not None:
        y += b
    return y.view(*x.shape[:-1], w.shape[0])  # (..., out)


log = logging.getLogger("gateway.engine.cpu_linear")

PROBE_TOKENS = (1, 5)  # a decode step and a verify step of k = 4
PROBE_REPS = 7
MARGIN = 0.95  # the weight-major forward must take at most 95% of torch's time
_verdicts: dict[tuple[Any, ...], bool] = {}


def weight_major_pays(model: Any, cache_kwarg: str) -> bool:
    """True when, on this machine, the model's own forward (a decode step and a verify step,
    on a short KV cache) is faster with the weight-major nn.Linear than with torch's:
    medians of interleaved repetitions, MARGIN to spare. Measuring whole forwards matters:
    the per-call overhead of the extra tensor ops is what decides on a fast BLAS. Measured
    once per model shape (config) and process; leaves the model as it found it."""
    linears = [
        m
        for m in model.modules()
        if type(m) is nn.Linear
        and m.weight.dtype == torch.float32
        and m.weight.device.type == "cpu"
    ]
    if not linears:
        return False
    key = (
        type(model).__name__,
        len(linears),
        tuple(sorted({tuple(m.weight.shape) for m in linears})),
    )
    if key not in _verdicts:
        kept = _kept_verdicts()
        name = _kept_name(key)
        if name in kept:
            _verdicts[key] = kept[name]
        else:
            _verdicts[key] = _measure(model, linears, cache_kwarg)
            _keep_verdicts({**kept, name: _verdicts[key]})
    return _verdicts[key]


_verdict_file: Path | None = None


def keep_verdicts(path: Path | None) -> None:
    """Keep each verdict of `weight_major_pays` in `path` (JSON) and read it back on the next
    start instead of measuring again: with a noisy machine the two forwards can measure
    within the margin of each other, and a verdict that flipped between starts would change
    the rounding of every output and the fingerprint of every precompiled step (a restart
    that compiles anew). A verdict is kept per model shape, torch version and
    `machine_identity`; deleting the file measures again. None: keep nothing."""
    global _verdict_file
    _verdict_file = path


FORM = (
    f"weight-major, oneDNN packed from {packed_linear.ROWS_MIN} rows"
    if packed_linear.AVAILABLE
    else "weight-major"
)
"""What the weight-major forward computes: part of a kept verdict's name, so that a verdict
measured for an earlier form is measured again."""


def _kept_name(key: tuple[Any, ...]) -> str:
    return repr((*key, torch.__version__, *machine_identity(), FORM))


def machine_identity() -> tuple[str, ...]:
    """What identifies this machine's speed for a kept verdict or a precompiled step
    (engine/compiled.py): CPU model, torch's CPU capability (its vector width), machine
    type, cores and torch's threads."""
    return (
        _cpu_model(), torch.backends.cpu.get_cpu_capability(), platform.machine(),
        str(os.cpu_count()), str(torch.get_num_threads()),
    )  # fmt: skip


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _kept_verdicts() -> dict[str, bool]:
    if _verdict_file is None or not _verdict_file.exists():
        return {}
    try:
        data = json.loads(_verdict_file.read_text())
        return {str(k): bool(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError) as exc:  # unreadable or damaged: measure again
        log.warning("linear forward verdicts in %s not read (%s): measuring", _verdict_file, exc)
        return {}


def _keep_verdicts(kept: dict[str, bool]) -> None:
    if _verdict_file is None:
        return
    try:
        _verdict_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{_verdict_file.name}.", dir=_verdict_file.parent)
        with os.fdopen(fd, "w") as f:  # a file of its own, whole on disk before it replaces
            f.write(json.dumps(kept, indent=1, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, _verdict_file)
    except OSError as exc:  # serves all the same; the next start measures again
        log.warning("linear forward verdict not kept in %s (%s)", _verdict_file, exc)


def _fp32_cpu(w: torch.Tensor) -> bool:
    return w.dtype == torch.float32 and w.device.type == "cpu"


def _measure(model: Any, linears: list[nn.Linear], kwarg: str) -> bool:
    """`kwarg`: the forward's cache argument (models.cache_kwarg)."""
    from transformers import DynamicCache

    vocab = int(model.get_output_embeddings().weight.shape[0])
    ids = torch.arange(16) % vocab  # (16,)

    def step_time() -> float:
        total = 0.0
        for t in PROBE_TOKENS:
            cache = DynamicCache()
            model(input_ids=ids[None, :8], use_cache=True, **{kwarg: cache})
            t0 = time.perf_counter()
            model(input_ids=ids[None, 8 : 8 + t], use_cache=True, **{kwarg: cache})
            total += time.perf_counter() - t0
        return total

    timings: dict[bool, list[float]] = {True: [], False: []}
    with torch.inference_mode():
        for rep in range(PROBE_REPS + 2):  # 2 warm-ups
            for weight_major in (False, True):
                for m in linears:
                    if weight_major:
                        m.forward = types.MethodType(forward, m)  # type: ignore[method-assign]
                    elif "forward" in m.__dict__:
                        del m.forward
                t = step_time()
                if rep >= 2:
                    timings[weight_major].append(t)
        for m in linears:  # as found: torch's forward (the caller patches if it pays)
            m.__dict__.pop("forward", None)
    pays = statistics.median(timings[True]) <= MARGIN * statistics.median(timings[False])
    if not pays:  # torch's forward from now on: the packs the timing made would never serve
        packed_linear.forget([m.weight for m in linears])
    return pays


def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The weight-major nn.Linear forward, bound to each patched layer as its `forward`.
    Named `forward`: a step compiled ahead of time (engine/compiled.py, Precompiled) saves
    a bound method as its object and its function's name, and loads it back by that name."""
    return linear(x, self.weight, self.bias)


def use_weight_major_linear(model: Any) -> int:
    """Give every fp32 nn.Linear of a CPU model the W @ x^T forward; returns how many."""
    count = 0
    for module in model.modules():
        if (
            type(module) is nn.Linear
            and module.weight.dtype == torch.float32
            and module.weight.device.type == "cpu"
        ):
            module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
            count += 1
    return count


def uses_weight_major(model: Any) -> bool:
    """Whether `use_weight_major_linear` gave this model's linear layers the weight-major
    forward."""
    return any(
        getattr(m.__dict__.get("forward"), "__func__", None) is forward
        for m in model.modules()
        if type(m) is nn.Linear
    )
