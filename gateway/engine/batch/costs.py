"""What a forward costs on this device, as a function of its shape (rows x tokens per row).

The cost model of speculation (gateway/costmodel.py) needs, at the current batch of B
rows, the verify cost v(k) = T(B, k + 1) / T(B, 1) (a verify forward of k + 1 tokens per
row, in standard steps) and the draft's cost ratio c = D(B) / T(B, 1). On a GPU v(k) stays
near 1 for small B and k; on this CPU it grows with rows x tokens: measured, not assumed.

`ForwardCosts` keeps an exponentially weighted mean of measured seconds per (row bucket,
tokens per row): rows round up to a power of two (1, 2, 4, 8, ...), so a handful of shapes
cover every batch. It is seeded at load by `probe` (a few timed forwards of each shape on a
scratch cache of realistic length) and then follows every real batch forward (`observe`),
so it tracks the machine's actual load. `seconds` interpolates the tokens axis linearly
between measured shapes (and extrapolates past the last); None before anything is measured.

A step is more than its forwards: planning, settling and emitting every row, handing the
events to the event loop, and, in a gateway, waiting for the interpreter lock while the
loop streams them. The batch measures that time too (`observe_overhead`: the seconds from
one decoding step's start to the next one's, less the forwards it ran), per row bucket and
by whether the step drafted, and the cost model counts it in every step (`overhead`,
`verify_costs`): without it a standard step looks cheaper against a speculative one than
it is, since a speculative step pays it once for several tokens.

Noise: a forward of more tokens never costs less than one of fewer, so `seconds` reads the
measured points as a non-decreasing curve (each point at most every later one). A probe
timed during a hiccup (seen here: 2-token forwards at 3.2x a 1-token one, 3-token ones at
1.0x) would otherwise make that k look hopeless, and a k that is never run is never
measured again. The probe takes its repeats round-robin over the shapes, so that a hiccup
spreads over all of them instead of filling one shape's median.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from gateway.engine.backends.base import slot_cache
from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.models import LoadedModel

WEIGHT = 0.2  # EWMA weight of a new observation
OVERHEAD_CAP = 4.0  # a step's overhead sample counts at most this many times the mean
PROBE_TOKENS = (1, 2, 3, 5, 9)  # tokens per row probed: k = 0, 1, 2, 4, 8
PROBE_CONTEXT = 128  # cached tokens per row during the probe


def row_bucket(rows: int) -> int:
    """The power of two at or above `rows`."""
    b = 1
    while b < rows:
        b *= 2
    return b


@dataclass
class ForwardCosts:
    """Measured seconds of one forward by (row bucket, tokens per row)."""

    means: dict[tuple[int, int], float] = field(default_factory=dict)
    # seconds a step spends outside its forwards, by (row bucket, whether it drafted)
    overheads: dict[tuple[int, bool], float] = field(default_factory=dict)

    def observe(self, rows: int, tokens: int, seconds: float) -> None:
        _ewma(self.means, (row_bucket(rows), tokens), seconds)

    def observe_overhead(self, rows: int, drafted: bool, seconds: float) -> None:
        """One decoding step of `rows` rows spent `seconds` outside its forwards. A sample
        counts at most OVERHEAD_CAP times the mean so far: between two steps the worker
        may also admit arrivals or run an admin call (a model load takes seconds), which
        is not what a step costs."""
        key = (row_bucket(rows), drafted)
        old = self.overheads.get(key)
        cap = float("inf") if old is None else OVERHEAD_CAP * old
        _ewma(self.overheads, key, min(max(0.0, seconds), cap))

    def overhead(self, rows: int, drafted: bool) -> float:
        """Seconds a step of `rows` rows spends outside its forwards: measured at the row
        bucket (else the nearest smaller one), a drafting step's else a standard one's and
        the other way round; 0 before any step was measured."""
        b = row_bucket(rows)
        measured = dict(self.overheads)  # one copy: the inference thread adds keys
        for rb in sorted({rb for rb, _ in measured if rb <= b}, reverse=True):
            for key in ((rb, drafted), (rb, not drafted)):
                if key in measured:
                    return measured[key]
        return 0.0

    def seconds(self, rows: int, tokens: int) -> float | None:
        """Estimated seconds of a forward of `rows` rows x `tokens` tokens; None when no
        shape of this row bucket (or a smaller one) was measured."""
        curve = self.curve(rows, tokens)
        return None if curve is None else curve[-1]

    def curve(self, rows: int, max_tokens: int) -> list[float] | None:
        """`seconds(rows, t)` for t = 1..max_tokens (index t - 1), the measured points read
        once; None when nothing of this row bucket (or a smaller one) was measured."""
        b = row_bucket(rows)
        means = dict(self.means)  # one copy: the inference thread adds shapes as it runs them
        below = [rb for rb, _ in means if rb <= b]
        if not below:
            return None
        rb = max(below)  # the bucket itself, else the nearest smaller one measured
        points = _non_decreasing(sorted((t, s) for (r, t), s in means.items() if r == rb))
        return [_interpolate(points, t) for t in range(1, max_tokens + 1)]

    def standard_step(self, rows: int) -> float | None:
        """Seconds of one standard step at `rows` rows: T(rows, 1) and the step's overhead."""
        one = self.seconds(rows, 1)
        return None if one is None else one + self.overhead(rows, False)

    def verify_costs(self, rows: int, k_max: int) -> tuple[float, ...] | None:
        """v(k) for k = 0..k_max (v(0) = 1): a step verifying k drafted tokens a row, its
        forward T(rows, k + 1) and a drafting step's overhead, in standard steps."""
        curve = self.curve(rows, k_max + 1)
        if curve is None:
            return None
        standard = curve[0] + self.overhead(rows, False)  # standard_step, curve read once
        if standard <= 0:
            return None
        spec = self.overhead(rows, True)
        return (1.0, *(max(1.0, (s + spec) / standard) for s in curve[1:]))


def _ewma(means: dict[Any, float], key: Any, seconds: float) -> None:
    old = means.get(key)
    means[key] = seconds if old is None else (1 - WEIGHT) * old + WEIGHT * seconds


def _non_decreasing(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Each point lowered to the smallest measured at or after it (sorted by tokens)."""
    out: list[tuple[int, float]] = []
    low = float("inf")
    for t, s in reversed(points):
        low = min(low, s)
        out.append((t, low))
    return out[::-1]


def _interpolate(points: list[tuple[int, float]], t: int) -> float:
    if len(points) == 1:
        return points[0][1] * t / points[0][0] if t > points[0][0] else points[0][1]
    for (t0, s0), (t1, s1) in itertools.pairwise(points):
        if t <= t1:
            if t <= t0:
                return s0
            return s0 + (s1 - s0) * (t - t0) / (t1 - t0)
    (t0, s0), (t1, s1) = points[-2], points[-1]  # past the last: the last slope
    return s1 + max(0.0, (s1 - s0) / (t1 - t0)) * (t - t1)


def probe(
    lm: LoadedModel,
    max_rows: int,
    tokens: tuple[int, ...] = PROBE_TOKENS,
    context: int = PROBE_CONTEXT,
    repeats: int = 3,
) -> ForwardCosts:
    """Time forwards of rows x tokens for row buckets up to `max_rows` on a scratch slot
    cache holding `context` tokens per row (median of `repeats` after one warm-up)."""
    costs = ForwardCosts()
    model, dev = lm.model, lm.device
    context = max(1, min(context, lm.context_length - max(tokens)))
    buckets = sorted({row_bucket(r) for r in range(1, max_rows + 1)})
    # The batch's own buffers where its faster forward was built for them.
    cache = (
        lm.fast.slot_cache(int(model.config.num_hidden_layers), lm.context_length)
        if (lm.fast is not None)
        else None
    )
    if cache is None:
        cache = slot_cache(model, buckets[-1], context + max(tokens))
    # A bucket past the cache's slots (6 rows: bucket 8) is timed at the rows it has.
    rows_list = sorted({min(b, cache.slots) for b in buckets})
    top = rows_list[-1]
    slots = [cache.take() for _ in range(top)]
    fill = [[(7 * i + j) % lm.vocab_size for j in range(context)] for i in range(top)]
    with torch.inference_mode():
        batched_forward(model, Step(cache, slots, fill, keep_last=True), lm.fast)
        for s in slots:
            cache.length[s] = context
        shapes = [(rows, t) for rows in rows_list for t in tokens]
        times: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
        for _ in range(repeats + 1):  # round-robin: a hiccup hits every shape alike
            for rows, t in shapes:
                feed = [[1 + (r + j) % (lm.vocab_size - 1) for j in range(t)] for r in range(rows)]
                t0 = time.perf_counter()
                batched_forward(model, Step(cache, slots[:rows], feed), lm.fast)
                sync(dev)
                times[(rows, t)].append(time.perf_counter() - t0)
        for (rows, t), spent in times.items():
            costs.means[(row_bucket(rows), t)] = statistics.median(spent[1:])  # after warm-up
    return costs


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a timing is real."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
