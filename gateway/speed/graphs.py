"""Captured CUDA graphs of the batch step: a step replays recorded kernels instead of
launching each one from Python.

Why: on a GPU the demo models' step is a few hundred small kernels; launching them one by
one from Python takes longer than running them. A CUDA graph records them once and replays
them with one call, the way vLLM and gpt-fast serve small batches.

Static shapes: a graph replays exactly the shapes, and the memory addresses, it recorded.
So a step is padded up to a bucket of rows x tokens x key span (powers of two; rows up to
the batch's, tokens up to compiled.MAX_TOKENS, the span from 64 keys to the slot's buffer),
and everything a step varies goes in through ONE integer tensor copied into the graph's
own input before it replays: per row and position, the token id, its position id, where
its key and value are written, the last key it sees; per row, its slot and the position
its logits are kept at (a draft's step). The attention mask is built inside the graph from
those. The KV buffers of the slot cache are written and read in place, so graphs belong to
one cache (they record its buffers' addresses); a cache's graphs are captured on first use
of each bucket and dropped with the cache.

Padding is inert: a padded token of a real row writes past the row's committed length
(overwritten by its next step, never attended before), a padded row writes into the first
row's slot past the slot's capacity (the slot cache's pad, never read) and sees one key, so
nothing real is changed and no row of the output is NaN. Padded outputs are cut off.

Exactness: a padded step multiplies more rows and attends over more (masked) keys, so a
kernel library may pick another kernel and round a logit otherwise than the eager step;
tests/unit/speed/test_graphs.py checks the bucketed step against the eager one (on the
CPU without capturing, on CUDA captured) and that any parting of greedy outputs is a near
tie.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gateway.speed.steps import slot_base, step_layout

if TYPE_CHECKING:
    from gateway.engine.batch.slots import SlotCache

log = logging.getLogger("gateway.speed.graphs")

# (inputs (6, B, T), arange(span), keys, values) -> (B, T or 1, V or H): compiled.py `_step_of`
Step = Callable[..., torch.Tensor]

MIN_SPAN = 64  # the smallest key-span bucket


def bucket(n: int, limit: int, least: int = 1) -> int:
    """The smallest power of two >= max(n, least), capped at `limit` (itself a bucket)."""
    b = least
    while b < n:
        b *= 2
    return min(b, limit)


@dataclass
class _Graph:
    inputs: torch.Tensor  # (6, B, T) int64 on the device: the step's only input
    run: Callable[[], torch.Tensor]  # the step on `inputs` (eager: the CPU tests)
    graph: torch.cuda.CUDAGraph | None = None
    output: torch.Tensor | None = None  # what the captured step wrote (static)

    def __call__(self) -> torch.Tensor:
        if self.graph is None:
            return self.run()
        self.graph.replay()
        assert self.output is not None
        return self.output


class GraphedSteps:
    """A model's step, padded to buckets and (on CUDA) captured once per bucket and cache.

    `step`: the compiled or eager step function (speed/compiled.py `_step_of` form);
    `device`: the model's; on CUDA the graphs are recorded (and every CUDA call made) on
    it, elsewhere the bucketed step runs eagerly (the CPU tests)."""

    def __init__(self, step: Step, max_rows: int, max_tokens: int, device: torch.device) -> None:
        self.step = step
        self.max_rows = max_rows
        self.max_tokens = max_tokens
        self.device = device
        self.capture = device.type == "cuda"
        self.captures = 0  # graphs recorded so far (all caches)
        self.capture_s = 0.0  # seconds spent recording them
        self.failed: str | None = None  # why recording failed: every step then runs eager
        self._pool = None
        if self.capture:
            with torch.cuda.device(device):
                self._pool = torch.cuda.graph_pool_handle()
        self._graphs: weakref.WeakKeyDictionary[SlotCache, dict[tuple[int, int, int], _Graph]]
        self._graphs = weakref.WeakKeyDictionary()

    def serves(self, rows: int, tokens: int, cache: SlotCache) -> bool:
        """Whether a step of this shape on this cache fits a bucket: rows up to max_rows,
        tokens up to max_tokens, padded to a width within the cache's pad (where a row's
        padded tokens land when it is near its capacity)."""
        return (
            self.failed is None
            and rows <= self.max_rows
            and tokens <= self.max_tokens
            and bucket(tokens, self.max_tokens) <= cache.pad
        )

    def buckets(self, rows: int, tokens: int, span: int, cache: SlotCache) -> tuple[int, int, int]:
        return (
            bucket(rows, self.max_rows),
            bucket(tokens, self.max_tokens),
            bucket(span, cache.capacity + cache.pad, MIN_SPAN),
        )

    def __call__(
        self, cache: SlotCache, slots: list[int], tokens: list[list[int]], starts: list[int],
        span: int, keep_last: bool,
    ) -> torch.Tensor | None:  # fmt: skip
        """(len(slots), T or 1, V or H): row r feeds tokens[r] from starts[r] into its slot;
        T is the longest feed. Only real rows come back; they are copies (the graph's
        output is overwritten by its next replay). None where recording the bucket's graph
        failed: the caller runs the step eager, and so does every later step (logged)."""
        b, t = len(tokens), max(len(x) for x in tokens)
        rows, width, keys = self.buckets(b, t, span, cache)
        try:
            graph = self._graph(cache, rows, width, keys)
        except Exception as exc:  # a step that cannot be captured here: eager from now on
            self.failed = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA graphs off, every step runs eager: recording failed (%s)",
                        self.failed)  # fmt: skip
            return None
        layout = self._layout(cache, slots, tokens, starts, rows, width)
        with torch.cuda.device(self.device) if self.capture else contextlib.nullcontext():
            graph.inputs.copy_(layout)
            return graph()[:b, : 1 if keep_last else t].clone()

    def _layout(
        self, cache: SlotCache, slots: list[int], tokens: list[list[int]], starts: list[int],
        rows: int, width: int,
    ) -> torch.Tensor:  # fmt: skip
        """The step's (6, rows, width) input: steps.py's `step_layout` (token ids,
        position ids, write positions, last key seen, slot and kept position); real rows
        padded with filler tokens, then filler rows (see the module's docstring)."""
        grid = step_layout(tokens, starts, slots, width)
        filler = rows - len(tokens)
        if filler:
            end = cache.capacity + cache.pad  # past the capacity: the slot's pad
            grid[0] += [0] * (width * filler)
            grid[1] += [0] * (width * filler)
            grid[2] += [*range(end - width, end)] * filler
            grid[3] += [0] * (width * filler)
            grid[4] += [slots[0]] * (width * filler)
            grid[5] += [0] * (width * filler)
        return torch.tensor(grid).view(6, rows, width)

    def _graph(self, cache: SlotCache, rows: int, width: int, span: int) -> _Graph:
        graphs = self._graphs.setdefault(cache, {})
        key = (rows, width, span)
        g = graphs.get(key)
        if g is None:
            g = graphs[key] = self._record(cache, rows, width, span)
        return g

    def _record(self, cache: SlotCache, rows: int, width: int, span: int) -> _Graph:
        import time

        keys, values = cache.buffers()
        device = keys[0].device
        end = cache.capacity + cache.pad
        # Filler rows only (slot 0, past its capacity): warming up and recording write
        # nothing a real row reads.
        inputs = torch.zeros((6, rows, width), dtype=torch.long, device=device)
        inputs[2] = torch.arange(end - width, end, device=device)

        def run() -> torch.Tensor:
            return self._body(inputs, keys, values, span)

        g = _Graph(inputs, run)
        if not self.capture:
            return g
        t0 = time.perf_counter()
        with torch.cuda.device(self.device):
            current = torch.cuda.current_stream()
            side = torch.cuda.Stream()
            side.wait_stream(current)
            try:
                with torch.cuda.stream(side):
                    for _ in range(2):  # the first calls: kernel choices, compiled guards
                        run()
            finally:
                current.wait_stream(side)
            g.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g.graph, pool=self._pool):
                    g.output = run()
            except BaseException:  # a failed capture may leave its stream current
                torch.cuda.set_stream(current)
                raise
        self.captures += 1
        self.capture_s += time.perf_counter() - t0
        return g

    def _body(
        self, inputs: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
        span: int,
    ) -> torch.Tensor:  # fmt: skip
        """The recorded step: the step unpacks its one input and builds the mask itself
        (compiled.py `_step_of`), over the bucket's key span."""
        base = slot_base(0, inputs.device)  # unread: a graph's filler rows share a slot
        return self.step(inputs, torch.arange(span, device=inputs.device), base, keys, values)
