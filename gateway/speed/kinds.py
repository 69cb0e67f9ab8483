"""The kinds of compiled step (rows x tokens: one or several each) and the constants of
what a compiled step serves and how it is compiled."""

from __future__ import annotations

from typing import Any

from gateway.engine.batch.slots import PREFILL_CHUNK

MAX_TOKENS = 16  # tokens a row feeds in a compiled decode, verify or drafting step
MAX_PREFILL = 2 * PREFILL_CHUNK
"""Prompt tokens a row feeds in a prefill chunk the compiled step serves (`serves`); longer
chunks (from a GATEWAY_PREFILL_CHUNK of about 205, whose lone rows take a quarter chunk
more: batch/chunks.py `TAIL`) run eager. The step's shapes are dynamic in the tokens,
so a chunk is the same graph as a verify step (no new trace,
`tests/unit/speed/test_compiled_store.py`)."""
HEAD_SHARE = 0.25
"""A target step serves prefill chunks (`CompiledForwards.prefill_all`) when its output
head has at most this share of its layers' weights: the demo target's is 0.2 (a 8192 x 256
head against 12 layers of 0.85M), and its chunks measured faster compiled with the head
at every position; a model with a large vocabulary for its width (0.38 for a 152k x
896 head over 24 layers of 15M) would spend that on the head."""
KINDS = frozenset({"1x1", "1xN", "Bx1", "BxN"})
FASTER = 0.97  # auto keeps a kind whose compiled step takes at most this share of eager's
INDUCTOR: dict[str, Any] = {
    "size_asserts": False,
    "post_grad_fusion_options": {"decompose_mm_pass": {}},
}
"""inductor options of the step's compile.

No size asserts: inductor's Python wrapper checks each input's sizes and strides on every
call (about 100 checks a step of the demo target), which the step's guards have checked
already, so they are pure per-call overhead; without them every kind measured faster.

Matrix products of one row as generated reductions (inductor's decompose_mm_pass; on a
CPU it takes products of exactly one row with weights up to 2048 x 2048, so on the demo
target the one-row one-token kind's projections, not its output head and no other kind):
torch's mm copies each such input first (inductor hands it a row of stride 0, which BLAS
refuses), 3 copies a layer, and calls the library for a few microseconds of work; the
reduction avoids both, and the one-row one-token step measured faster with it. With two to
eight rows the reductions measured slower than the library, which is why only one row is
taken. The sums run in another order than
BLAS's, so a greedy choice may part from eager at a near tie (`python -m benchmarks
engine_compiled` counts partings). A model given the weight-major linear (cpu_linear.py)
writes its one-row products as that reduction itself, output head included."""


def kind(rows: int, tokens: int) -> str:
    """A step's kind: one row x one token, one row x several tokens, several rows x one,
    several x several (torch specialises sizes of 1, so each kind is a graph of its own)."""
    if rows == 1:
        return "1x1" if tokens == 1 else "1xN"
    return "Bx1" if tokens == 1 else "BxN"


def warm_kinds(max_rows: int) -> list[tuple[int, int]]:
    """(rows, tokens) of a step of each kind `warm_up` compiles, in its order."""
    return [(b, t) for b, t in ((1, 3), (2, 1), (2, 3), (1, 1)) if b <= max_rows]
