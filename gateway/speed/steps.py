"""A step run through a model's compiled forwards (compiled.py): its one input tensor, the
arrangement of its rows for a contiguous step, the head a step left to the caller.

`compiled_step` takes a step of batch/forward.py (`Step`) when the compiled forwards serve
it and returns None otherwise; the lean or the model's own forward then runs it
(fast.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from gateway.engine.batch.forward import Step, int_tensor, row_layout, span_keys
from gateway.engine.batch.masks import visible

if TYPE_CHECKING:
    from gateway.speed.compiled import CompiledForwards


def compiled_step(
    compiled: CompiledForwards, step: Step, device: torch.device
) -> list[torch.Tensor] | None:
    """The step's output through `compiled` (on CUDA as captured graphs, graphs.py), or
    None where it does not serve the step."""
    tokens, slots, cache, keep_last = step.tokens, step.slots, step.cache, step.keep_last
    b = len(slots)
    lengths = [len(x) for x in tokens]
    t = max(lengths)
    starts = step.starts
    span = step.span
    if not (compiled.serves(b, t, keep_last, step.backbone, step.head) and cache.allocated):
        return None
    if span <= 1:
        return None  # a span of 1: no traced step takes it
    # Several tokens a row through a contiguous step: rows as slots lo, lo + 1, ...
    # (compiled.py `_layer`); out of order or with gaps, they are arranged.
    view = compiled.contiguous and t > 1
    arrange = view and not _ranged(slots)
    if arrange and t > cache.pad:
        return None  # no room in a slot's pad for a filler row (`contiguous_rows`)
    every = compiled.prefills_all(keep_last)  # a target's prefill
    graphs = compiled.graphs if not every else None
    if graphs is not None and graphs.serves(b, t, cache):  # padded to a bucket
        out = graphs(cache, slots, tokens, starts, span, keep_last)
        if out is not None:  # None: recording failed, the step runs eager
            return [out[r, : 1 if keep_last else n] for r, n in enumerate(lengths)]
    # ONE input tensor (the step unpacks it and builds the mask inside its graph).
    where: list[int] | range = range(b)
    if arrange:
        slots, tokens, starts, where = contiguous_rows(slots, tokens, starts, cache.capacity)
    lo = slots[0] if view else 0
    rows = len(slots)
    inputs = int_tensor(step_layout(tokens, starts, slots, t)).to(device)
    out = compiled(
        inputs.view(6, rows, t), span_keys(span, device), slot_base(lo, device), cache
    )  # (rows, T or 1, H or V)
    if compiled.outer_head is not None and t > 1:  # the step left the head to us
        return _outer_head(compiled.outer_head, out, where, lengths, every)
    if every:  # every position came back: each row's last
        return [out[where[r], n - 1 : n] for r, n in enumerate(lengths)]
    return [out[where[r], : 1 if keep_last else n] for r, n in enumerate(lengths)]


def kept_rows(h: torch.Tensor, keep: list[int]) -> torch.Tensor:
    """The positions of (B, T, H) that a keep_last step's head runs on: row r's keep[r],
    (B, 1, H); one row keeps its last two positions, (1, 2, H), of which the caller uses the
    last (a BLAS product of one row rounds otherwise than a product of several, on every
    CPU measured; which several-row counts round alike depends on the CPU and its BLAS)."""
    b, t = h.shape[0], h.shape[1]
    if b > 1:
        return h[torch.arange(b), torch.tensor(keep)][:, None]
    return h[:, max(0, t - 2) :]


def _outer_head(
    head: Callable[[torch.Tensor], torch.Tensor], out: torch.Tensor,
    where: list[int] | range, lengths: list[int], last: bool,
) -> list[torch.Tensor]:  # fmt: skip
    """Logits of a compiled step that left its output head to the caller (compiled.py
    `CompiledForwards.outer_head`; `out`: (rows, T, H), the final norm's output): each
    row's last position (`last`, a prefill chunk: (1, V) each; the rows the eager lean
    decoder's head runs on, lean.py `kept_rows`) or every position of the rows
    in `where` (a verify step: (n, V) each)."""
    rows = out if isinstance(where, range) and len(where) == out.shape[0] else out[list(where)]
    if not last:
        logits = head(rows)  # (B, T, V)
        return [logits[r, :n] for r, n in enumerate(lengths)]
    kept = kept_rows(rows, [n - 1 for n in lengths])  # (B, 1, H), or (1, 2, H)
    logits = head(kept.reshape(-1, kept.shape[-1]))  # (B or 2, V)
    return [logits[r : r + 1] for r in range(len(lengths))] if len(lengths) > 1 else [logits[-1:]]


def _ranged(slots: list[int]) -> bool:
    """Whether `slots` are lo, lo + 1, ... in order."""
    return slots == list(range(slots[0], slots[0] + len(slots)))


def contiguous_rows(
    slots: list[int], tokens: list[list[int]], starts: list[int], capacity: int
) -> tuple[list[int], list[list[int]], list[int], list[int]]:
    """The rows of a step as slots lo, lo + 1, ..., hi in order (what a contiguous compiled
    step reads as one view, speed/compiled.py `_layer`), a filler row in each slot between
    them that is not in the step: (slots, tokens, starts, where), where[i] the new index of
    row i. A filler row feeds one token at the slot's capacity, so that its writes land in
    the slot's pad (never read) and it widens no row's key span; its output is dropped."""
    at = {slot: i for i, slot in enumerate(slots)}
    lo, hi = min(slots), max(slots)
    out_slots = list(range(lo, hi + 1))
    out_tokens = [tokens[at[s]] if s in at else [0] for s in out_slots]
    out_starts = [starts[at[s]] if s in at else capacity for s in out_slots]
    return out_slots, out_tokens, out_starts, [slot - lo for slot in slots]


def step_layout(
    tokens: list[list[int]], starts: list[int], slots: list[int], width: int
) -> list[list[int]]:
    """A compiled step's one input, as six flat lists of len(tokens) x width: `row_layout`'s
    four, then each row's slot and the position its logits are kept at (a draft's step),
    repeated along the row (speed/compiled.py `_step_of` unpacks it)."""
    grid = row_layout(tokens, starts, width)
    grid += [[], []]
    for row, slot in zip(tokens, slots, strict=True):
        grid[4] += [slot] * width
        grid[5] += [len(row) - 1] * width
    return grid


def step_mask(
    last_seen: torch.Tensor, keys: torch.Tensor, window: int | None, dtype: torch.dtype
) -> torch.Tensor:
    """A uniform layout's mask as a compiled step builds it inside its graph (no kept
    tensors; a query that sees no committed key sees key 0, which changes nothing for the
    others)."""
    zero = torch.zeros((), dtype=dtype, device=last_seen.device)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=last_seen.device)
    return torch.where(visible(last_seen, keys, window, empty=True), zero, low)


_BASES: dict[torch.device, torch.Tensor] = {}


def slot_base(lo: int, device: torch.device) -> torch.Tensor:
    """A tensor of lo + 2 elements: how a compiled step learns its first row's slot lo as a
    size (a value would be data the graph cannot slice by; +2: torch specialises sizes 0
    and 1), sliced from one kept tensor per device."""
    base = _BASES.get(device)
    if base is None or base.shape[0] < lo + 2:
        base = _BASES[device] = torch.zeros(max(lo + 2, 64), dtype=torch.int8, device=device)
    return base[: lo + 2]
