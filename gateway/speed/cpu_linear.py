"""fp32 linear layers for decode-sized inputs on CPU: y^T = W x^T instead of y = x W^T.

A decode step feeds 1 token and a verify step k + 1, so every nn.Linear multiplies a few
rows by a large weight. torch computes x @ W^T; on the CPU that call grows with the row
count much faster than W @ x^T does (our reading: MKL packs the large operand on every call
in the first form, the small one in the second). A single row is doubled (by `torch.cat`,
which is cheaper than `repeat`), because MKL's one-column kernel is slower than its
two-column one.
Same fp32 arithmetic, other summation blocking: results differ from x @ W^T by rounding
(~1e-7 relative), in standard and speculative decoding alike. Inputs with more than
ROWS_MAX rows (long prefills), autograd, and weights no longer fp32 on CPU keep torch's own
path. The output is laid out as F.linear's (contiguous), so downstream kernels (attention)
are the ones torch would pick.
`benchmarks/engine_dtype.py` measures both forwards side by side.

From packed_linear.ROWS_MIN rows on (a verify step of k >= 3, a batch's step, a prefill
chunk), the product runs on oneDNN with the weight packed once instead (packed_linear.py:
cheaper at several rows, and a row rounds the same alone and among up to 128).

Traced by torch.compile (speed/compiled.py), one row is multiplied by W and summed along
the input instead (a reduction inductor generates and fuses, with no library call and no
doubling), output head included; several rows call the product above as the op
`gateway::linear_rows`, which picks its form by the rows at run time, so a compiled kind
(1 x several tokens, several rows) stays one graph for every row count. The one-row
reduction measured faster on CPU than both the library call and torch's own linear
(inductor's decompose_mm_pass takes one-row products, but not a large output head).

Whether it pays depends on the CPU and its BLAS: on some CPUs it makes verify steps
cheaper, on others (e.g. with AMX under MKL) it makes decoding slower. So `accelerate`
(attach.py) measures by default (`weight_major_pays`), once per process and model shape, and patches
only where it is faster. What it times is the products themselves: the model's own weights,
each in turn as a step reads them, multiplied in both forms by inputs of a decode step's, a
verify step's and a batch step's rows (PROBE_ROWS). It does not time the model's eager
transformers forward: its Python and dispatch overhead hides the products, so such a timing
can keep torch's linear where the compiled steps, in which the products are most of the
time, run faster weight-major.
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

from gateway.speed import packed_linear

ROWS_MAX = 128
"""Above the largest verify (engine.MAX_K + 1 rows): every decode step and every verify step
take the weight-major path, so both modes round alike; in eager code longer prefills keep
torch's. A compiled step sends every product of several rows to the op, whatever its rows:
a traced branch on them would be a guard (rows x tokens <= 128) that a precompiled step's
longer prefill chunks and 16-row verify steps fail, each compiled anew while serving (a
stall of seconds); and the op's oneDNN form measured faster than torch's linear at those row counts
too."""


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, w, b), computed as W @ x^T when that is the faster form (see above)."""
    rows = x.numel() // x.shape[-1]
    compiling = torch.compiler.is_compiling()
    if (
        (not compiling and rows > ROWS_MAX)  # traced: no branch on the rows (ROWS_MAX says why)
        or torch.is_grad_enabled() or w.dtype != torch.float32 or w.is_cuda
    ):  # fmt: skip
        return F.linear(x, w, b)
    x2 = x.reshape(rows, x.shape[-1])  # (rows, in)
    # traced, one row: (1, out), a generated reduction; else (rows, out) by the op, traced
    # as an extern kernel (see above)
    one = rows == 1 and compiling
    y = (x2 * w).sum(-1)[None] if one else torch.ops.gateway.linear_rows(x2, w)
    if b is not None:
        y += b
    return y.view(*x.shape[:-1], w.shape[0])  # (..., out)


log = logging.getLogger("gateway.speed.cpu_linear")

PROBE_ROWS = (1, 5, 8)  # a decode step's rows, a verify step's (k = 4), a batch step's
PROBE_REPS = 7
MARGIN = 0.95  # the weight-major forward must take at most 95% of torch's time
ONE_ROW_MAX = 1.0
"""...and one row's products (a decode step: standard decoding, a draft's steps) at most
torch's time: at the sizes people run, products are bound by reading the weights, and
MKL's two-column product (the doubled row) can take twice torch's one-row time while the
packed verify steps still win the sum; serving weight-major there would make every
standard step slower and keep a packed copy of every weight for the verify steps."""
_verdicts: dict[tuple[Any, ...], bool] = {}


def weight_major_pays(model: Any, served: list[nn.Linear] | None = None) -> bool:
    """True when, on this machine, the model's own linear layers multiply a step's rows
    faster with the weight-major forward than with torch's (`_measure`): medians of
    interleaved repetitions, MARGIN to spare. `served`: the linear layers the model's steps
    multiply by, where those are not its own modules (a compiled step's joined projections,
    speed/lean.py `Joined`); by default its fp32 CPU nn.Linear modules. Measured once per
    set of shapes and process; leaves the model as it found it."""
    linears = [
        m
        for m in (model.modules() if served is None else served)
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
            _verdicts[key] = _measure(linears)
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
) + f"; products of {PROBE_ROWS} rows timed, one row no slower"
"""What the weight-major forward computes and how the verdict was measured: part of a kept
verdict's name, so that a verdict measured for an earlier form or in an earlier way is
measured again."""


def _kept_name(key: tuple[Any, ...]) -> str:
    return repr((*key, torch.__version__, *machine_identity(), FORM))


def machine_identity() -> tuple[str, ...]:
    """What identifies this machine's speed for a kept verdict or a precompiled step
    (speed/compiled.py): CPU model, torch's CPU capability (its vector width), machine
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


def _measure(linears: list[nn.Linear]) -> bool:
    """Whether `linear` (the weight-major form, packed from packed_linear.ROWS_MIN rows)
    multiplies inputs of PROBE_ROWS rows by every weight of `linears`, in the model's order
    (each weight read from memory in turn, as a step reads them), in at most MARGIN of the
    time F.linear takes, one row in at most ONE_ROW_MAX of it. Timing the products and not
    a forward: see the module's docstring. The extra tensor ops of the weight-major form
    (reshapes, the one-row doubling, the pack lookup) are timed with it, since on a fast
    BLAS they are what decides."""
    g = torch.Generator().manual_seed(0)  # the global RNG (seeded sampling) is left alone
    inputs = {
        (rows, m.in_features): torch.randn(rows, m.in_features, generator=g)
        for m in linears
        for rows in PROBE_ROWS
    }

    def step_time(weight_major: bool, rows: int) -> float:
        form = linear if weight_major else F.linear  # looked up now: tests count the calls
        t0 = time.perf_counter()
        for m in linears:
            form(inputs[(rows, m.in_features)], m.weight, m.bias)
        return time.perf_counter() - t0

    def medians(rows: int) -> dict[bool, float]:
        timings: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(PROBE_REPS + 2):  # 2 warm-ups (at several rows, the first packs)
            for weight_major in (False, True):
                t = step_time(weight_major, rows)
                if rep >= 2:
                    timings[weight_major].append(t)
        return {wm: statistics.median(ts) for wm, ts in timings.items()}

    with torch.inference_mode():
        one = medians(PROBE_ROWS[0])  # first, and alone if it decides: one row packs nothing
        if one[True] > ONE_ROW_MAX * one[False]:
            return False
        several = [medians(rows) for rows in PROBE_ROWS[1:]]
    total = {wm: one[wm] + sum(m[wm] for m in several) for wm in (False, True)}
    pays = total[True] <= MARGIN * total[False]
    if not pays:  # torch's forward from now on: the packs the timing made would never serve
        packed_linear.forget([m.weight for m in linears])
    return pays


def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The weight-major nn.Linear forward, bound to each patched layer as its `forward`.
    Named `forward`: a step compiled ahead of time (speed/store.py, Precompiled) saves
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
