"""fp32 linear layers for decode-sized inputs on CPU: y^T = W x^T instead of y = x W^T.

A decode step feeds 1 token and a verify step k + 1, so every nn.Linear multiplies a few
rows by a large weight. torch computes x @ W^T; on the CPU we measured (MKL, AMD EPYC, 2
cores) that call grows with the row count much faster than W @ x^T does (our reading: MKL
packs the large operand on every call in the first form, the small one in the second). A
single row is doubled, because MKL's one-column kernel is slower than its two-column one.
Same fp32 arithmetic, other summation blocking: results differ from x @ W^T by rounding
(~1e-7 relative), in standard and speculative decoding alike. Inputs with more than
ROWS_MAX rows (long prefills), autograd, and weights no longer fp32 on CPU keep torch's own
path. The output is laid out as F.linear's (contiguous), so downstream kernels (attention)
are the ones torch would pick.
`benchmarks/engine_dtype.py` measures both forwards side by side.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROWS_MAX = 128  # above the largest verify (engine.MAX_K + 1 rows): every decode step and
# every verify step take this path, so both modes round alike; longer prefills keep torch's


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, w, b), computed as W @ x^T when that is the faster form (see above)."""
    rows = x.numel() // x.shape[-1]
    if rows > ROWS_MAX or torch.is_grad_enabled() or w.dtype != torch.float32 or w.is_cuda:
        return F.linear(x, w, b)
    x2 = x.reshape(rows, x.shape[-1])  # (rows, in)
    cols = x2.repeat(2, 1) if rows == 1 else x2  # one row is doubled (see above)
    y = (w @ cols.T)[:, :rows].T.contiguous()  # (rows, out), laid out as F.linear's
    if b is not None:
        y += b
    return y.view(*x.shape[:-1], w.shape[0])  # (..., out)


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
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
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
            count += 1
    return count
