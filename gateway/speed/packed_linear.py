"""fp32 products of several rows by a linear layer's weight on oneDNN, the weight packed once.

What it replaces: cpu_linear's W @ x^T (MKL), whose cost grows fast with the rows of a
verify step, a batch's step or a prefill chunk. torch's oneDNN linear with the weight
reordered once into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`,
what inductor's freezing pass does for a frozen model) reads the weight in the order its
kernel wants, so a product of 4 to 40 rows costs little more than one: measured on CPU
it is a few times cheaper than W @ x^T at a few rows for the large output head and the
gate-and-up projection, and still cheaper at 40 rows (docs/decisions/compiled-step-history.md
has the effect on whole steps). Fewer
than ROWS_MIN rows keep W @ x^T (see ROWS_MIN).

Exactness: oneDNN's sums run in the same order whatever the row count (a row's result
bitwise equal alone and among up to 128 rows, on every demo shape), where MKL's W @ x^T
rounds a row differently from 5 rows on. Both round differently from torch's x @ W^T
(~1e-7 relative), in standard and speculative decoding alike; a greedy choice can part
between a one-row step and a verify step only at a near tie, as with W @ x^T.

Lifetime: a packed copy is kept per weight (data pointer, shape, strides), with a weak
reference to the tensor it was made from; it is dropped when that tensor dies and not
used once the tensor points at other memory (`Joined` re-points a layer's projections).
A tensor with a live weight's key reads that weight's memory (the weight itself, or a view
of the same span: a joined projection's part), so a hit has its values as long as weights
are never written in place, which nothing here does (a load makes new tensors; caches and
outputs are what is written). A stale pack is dropped when the next weight is packed, and
a model whose layers keep torch's forward keeps none (cpu_linear `forget`s them). The
copies take the linear weights' memory again, and a compiled model's joined projections
are packed as well: the demo target's 49 MB of linear weights (its head included) have
78 MB of packs, the demo pair and draft v1 102 MB.

The product is the op `gateway::linear_rows`, eager and compiled alike (inductor calls it
as an extern kernel; it finds its pack by the weight it is given, and picks its form by
the rows at run time, so a compiled kind stays one graph). Its CPU kernel is C++
(linear_rows.cpp, built and loaded by native.py) where the host can build it, else
`PythonKernel` here: the same calls, bitwise the same products, each with its own packs.
The C++ one saves the Python kernel's body and its dispatch back into Python on every call,
a noticeable share of a compiled several-token step, whose products are most of its time.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gateway.speed import native

AVAILABLE = bool(
    torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    and hasattr(torch.ops.mkldnn, "_linear_pointwise")
)

ROWS_MIN = 4
"""Products of fewer rows run as W @ x^T: a oneDNN call has a fixed cost before any work,
several times MKL's for a small product, which the rows it saves must pay back. Timing a
step's products, each weight read from memory in turn (the weights do not stay cached),
W @ x^T is as fast or faster up to 3 rows and packed oneDNN faster from 4 rows on, its lead
growing with the rows."""

_Key = tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype]


@dataclass
class _Pack:
    source: weakref.ref[torch.Tensor]
    packed: torch.Tensor


def _key(w: torch.Tensor) -> _Key:
    return (w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype)


class PythonKernel:
    """The op's kernel in Python and its packs: what serves where the C++ kernel
    (linear_rows.cpp, the same calls and pack lifetimes) is not built (native.py)."""

    name = "Python"

    def __init__(self) -> None:
        self.packs: dict[_Key, _Pack] = {}
        self.made = 0  # how many weights were packed in this process

    def product(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x @ w^T for x (rows, in), w (out, in) fp32 on the CPU: (rows, out), contiguous.
        From ROWS_MIN rows on oneDNN with `w` packed, below as W @ x^T (`weight_major`)."""
        if x.shape[0] < ROWS_MIN or not AVAILABLE:
            return weight_major(x, w)
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self.packed(w), None, "none", [], ""
        )

    def packed(self, w: torch.Tensor) -> torch.Tensor:
        """`w` (out, in) in oneDNN's layout, packed on first use and kept while `w` lives."""
        key = _key(w)
        hit = self.packs.get(key)
        if hit is not None:
            source = hit.source()
            if source is w or (source is not None and _key(source) == key):
                return hit.packed
        self._sweep()
        pack = torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous())
        self.packs[key] = _Pack(weakref.ref(w, functools.partial(self._drop, key)), pack)
        self.made += 1
        return pack

    def packs_made(self) -> int:
        return self.made

    def packs_kept(self) -> int:
        return len(self.packs)

    def has_pack(self, w: torch.Tensor) -> bool:
        """Whether a pack would serve `w` without packing it again."""
        hit = self.packs.get(_key(w))
        source = None if hit is None else hit.source()
        return source is not None and _key(source) == _key(w)

    def _sweep(self) -> None:
        """Drop the packs whose weight now points at other memory (re-pointed; its own pack
        is made anew): they would never serve again. Runs before each new pack (a load)."""
        self._discard(lambda source, key: source is not None and _key(source) != key)

    def forget(self, weights: list[torch.Tensor]) -> None:
        """Drop the packs made from `weights` (their layers went back to torch's forward)."""
        gone = {id(w) for w in weights}
        self._discard(lambda source, key: source is not None and id(source) in gone)

    def _discard(self, stale: Callable[[torch.Tensor | None, _Key], bool]) -> None:
        """Drop every pack `stale(its live weight or None, its key)` says so of."""
        for key, hit in list(self.packs.items()):  # a snapshot: a weight may die meanwhile
            if stale(hit.source(), key):
                self.packs.pop(key, None)

    def _drop(self, key: _Key, _dead: object = None) -> None:
        """A weight died (weakref callback): its pack goes, unless a new one took the key."""
        hit = self.packs.get(key)
        if hit is not None and hit.source() is None:
            self.packs.pop(key, None)


class NativeKernel:
    """The C++ kernel's packs (linear_rows.cpp), seen from here; `product` calls the op."""

    name = "C++"

    def product(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.ops.gateway.linear_rows.default(x, w)  # type: ignore[no-any-return]

    def packs_made(self) -> int:
        return int(torch.ops.gateway.packs_made())

    def packs_kept(self) -> int:
        return int(torch.ops.gateway.packs_kept())

    def has_pack(self, w: torch.Tensor) -> bool:
        return bool(torch.ops.gateway.has_pack(w))

    def forget(self, weights: list[torch.Tensor]) -> None:
        torch.ops.gateway.forget_packs(weights)


def weight_major(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w^T computed as W @ x^T (MKL; cpu_linear.py says why), one row doubled."""
    rows = x.shape[0]
    cols = torch.cat((x, x)) if rows == 1 else x
    return (w @ cols.T)[:, :rows].T.contiguous()  # (rows, out), laid out as F.linear's


torch.library.define("gateway::linear_rows", "(Tensor x, Tensor w) -> Tensor")


@torch.library.register_fake("gateway::linear_rows")
def _shape(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))


PYTHON = PythonKernel()
NATIVE = native.load()
"""Whether the op's CPU kernel is the C++ one (native.py): it skips the Python kernel's
body and the dispatch back into Python on every call."""
if NATIVE:
    torch.ops.gateway.configure_packs(ROWS_MIN, AVAILABLE)
else:
    torch.library.impl("gateway::linear_rows", "CPU", PYTHON.product)
KERNEL: PythonKernel | NativeKernel = NativeKernel() if NATIVE else PYTHON
"""The op's kernel and its packs: what `product`, `forget` and the tests' counters read."""


def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w^T by the op `gateway::linear_rows` (x (rows, in), w (out, in), fp32 on the
    CPU): (rows, out), contiguous; from ROWS_MIN rows on oneDNN with `w` packed."""
    return torch.ops.gateway.linear_rows.default(x, w)  # type: ignore[no-any-return]


def forget(weights: list[torch.Tensor]) -> None:
    """Drop the packs made from `weights` (their layers went back to torch's forward)."""
    KERNEL.forget(weights)
