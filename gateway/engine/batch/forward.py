"""One target forward for many rows of a SlotCache: each row's own tokens, positions and mask.

Row r feeds tokens t_r,0..t_r,n-1 at positions length[r]..length[r]+n-1 (its committed
length onward). Rows are right-padded to the longest; position ids are each row's own; the
mask lets query j of row r see exactly positions 0..length[r]+j of its own slot (a sliding
or chunked layer sees fewer: masks.py builds one mask per kind of layer). A padded query
sees the row's committed positions only (its output is dropped). After the forward the
caller commits what it keeps by setting `cache.length[slot]`; nothing is copied or cropped.
"""

from __future__ import annotations

import itertools
import weakref
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from gateway.engine.backends.base import BackendCache
from gateway.engine.batch.decoder import kept_rows
from gateway.engine.batch.masks import AttentionLayout, attention_layout, layer_masks, visible
from gateway.engine.batch.slots import SlotCache

if TYPE_CHECKING:
    from gateway.engine.batch.decoder import LeanDecoder
    from gateway.engine.compiled import CompiledForwards
    from gateway.engine.draft_head import DraftHead


def batched_forward(
    model: Any,
    kwarg: str,
    cache: SlotCache,
    slots: list[int],
    tokens: list[list[int]],
    device: torch.device,
    keep_last: bool = False,
    backbone: bool = False,
    compiled: CompiledForwards | None = None,
    decoder: LeanDecoder | None = None,
    head: DraftHead | None = None,
) -> list[torch.Tensor]:
    """Logits per row: (len(tokens[r]), V) each, or (1, V) of the last token with keep_last;
    with backbone, the last hidden states instead ((.., H), the output head skipped); with
    `head` (a draft's reduced head, draft_head.py), the logits through that head.
    Writes each row's tokens into its slot at length[slot].. (the caller commits). With
    `compiled`, the model's compiled step runs the steps it was built for (engine/compiled.py;
    on CUDA as captured graphs, engine/graphs.py);
    the others run `decoder`, the lean forward (batch/decoder.py: the same logits as the
    model's forward, less overhead), or without one the model's own forward."""
    if isinstance(cache, BackendCache):  # a backend keeps the KV (engine/backends/base.py)
        if head is not None:
            raise ValueError("a backend's model has no reduced drafting head")
        return cache.forward(slots, tokens, keep_last, logits=not backbone)
    b = len(slots)
    lengths = [len(x) for x in tokens]
    t = max(lengths)
    starts = [cache.length[s] for s in slots]
    if any(st + n > cache.capacity for st, n in zip(starts, lengths, strict=True)):
        raise ValueError("a row would write past its slot's capacity")
    if max(starts) + t > cache.capacity + cache.pad:
        raise ValueError("a padded row would write past its slot's padding")
    span = max(st + n for st, n in zip(starts, lengths, strict=True))
    if compiled is not None and not (
        compiled.serves(b, t, keep_last, backbone, head) and cache.allocated and span > 1
    ):
        compiled = None  # this step runs eager (a span of 1: no traced step takes it)
    # Several tokens a row through a contiguous step: rows as slots lo, lo + 1, ...
    # (compiled.py `_layer`); out of order or with gaps, they are arranged.
    view = compiled is not None and compiled.contiguous and t > 1
    arrange = view and not _ranged(slots)
    if arrange and t > cache.pad:
        compiled = None  # no room in a slot's pad for a filler row (`contiguous_rows`): eager
    every = compiled is not None and compiled.prefills_all(keep_last)  # a target's prefill
    graphs = compiled.graphs if compiled is not None and not every else None
    if graphs is not None and graphs.serves(b, t, cache):  # padded to a bucket
        out = graphs(cache, slots, tokens, starts, span, keep_last)
        if out is not None:  # None: recording failed, the step runs eager below
            return [out[r, : 1 if keep_last else n] for r, n in enumerate(lengths)]
    if compiled is not None:
        # ONE input tensor (the step unpacks it and builds the mask inside its graph):
        # building a mask and six tensors here measured 0.1 ms a forward, this 0.06.
        where: list[int] | range = range(b)
        if arrange:
            slots, tokens, starts, where = contiguous_rows(slots, tokens, starts, cache.capacity)
        lo = slots[0] if view else 0
        rows = len(slots)
        inputs = _ints(step_layout(tokens, starts, slots, t)).to(device)
        out = compiled(
            inputs.view(6, rows, t), span_keys(span, device), slot_base(lo, device), cache
        )  # fmt: skip  (rows, T or 1, H or V)
        if compiled.outer_head is not None and t > 1:  # the step left the head to us
            return _outer_head(compiled.outer_head, out, where, lengths, every)
        if every:  # every position came back: each row's last
            return [out[where[r], n - 1 : n] for r, n in enumerate(lengths)]
        return [out[where[r], : 1 if keep_last else n] for r, n in enumerate(lengths)]
    layout, dtype = model_layout(model)
    empty = any(st == 0 and n < t for st, n in zip(starts, lengths, strict=True))
    packed = _ints(row_layout(tokens, starts, t)).view(4, b, t)
    ids, position_ids, positions, last_seen = packed[0], packed[1], packed[2], packed[3]
    # One row feeding one token, every layer attending in full, sees its whole slot: no
    # mask needed (the fast SDPA path).
    mask: torch.Tensor | dict[str, torch.Tensor] | None = None
    if b > 1 or t > 1 or not layout.all_full:
        zero, low = _fill(dtype)
        masks = layer_masks(layout, last_seen, span_keys(span, _CPU), empty, zero, low)
        mask = _to(masks, device)
    if b == 1:
        cache.step_single = (slots[0], starts[0])
    else:
        cache.step_single = None
        cache.step_rows = torch.tensor(slots, dtype=torch.long)[:, None].to(device)  # (B, 1)
        cache.step_positions = positions.to(device)
        lo = min(slots)
        cache.step_range = (lo, lo + b) if slots == list(range(lo, lo + b)) else None
    cache.step_span = span
    hidden = backbone or head is not None
    if decoder is not None:
        keep = [n - 1 for n in lengths] if keep_last else None
        assert not isinstance(mask, dict)  # a lean decoder serves uniform layouts only
        out = decoder(
            ids.to(device),
            mask,
            position_ids.to(device),
            cache,
            keep=keep,
            backbone=hidden,
        )  # fmt: skip  (B, T or 1, H or V)
    else:
        forward = backbone_of(model) if hidden else model
        res = forward(
            input_ids=ids.to(device),
            attention_mask=mask,
            position_ids=position_ids.to(device),
            use_cache=True,
            **{kwarg: cache},
        )
        out = res.last_hidden_state if hidden else res.logits  # (B, T, H or V)
        if keep_last:
            out = torch.stack([out[r, n - 1] for r, n in enumerate(lengths)])[:, None]  # (B, 1, ..)
    if head is not None:
        out = head(out)  # (B, T or 1, V)
    return [out[r, : 1 if keep_last else n] for r, n in enumerate(lengths)]


def backbone_of(model: Any) -> Any:
    """The model without its output head: its base model, or, for a family whose base
    model prefix names no submodule (Llama 4's text model), its `model`."""
    inner = model.base_model
    return model.model if inner is model else inner


def row_layout(tokens: list[list[int]], starts: list[int], width: int) -> list[list[int]]:
    """A step's inputs as four flat lists of len(tokens) x width, row by row: token ids
    right-padded with 0; position ids (a padded token's is its row's last real one: learned
    position tables end at the context length, and a padded output is dropped anyway);
    write positions (length onward); the last key each query sees (a padded query: the
    committed ones). Built as Python lists and turned into ONE tensor: a step's shaping
    used to be a dozen small torch ops, ~0.1 ms a forward."""
    grid: list[list[int]] = [[], [], [], []]
    for row, st in zip(tokens, starts, strict=True):
        n = len(row)
        pad = width - n
        grid[0] += [*row, *[0] * pad]
        grid[1] += [*range(st, st + n), *[st + n - 1] * pad]
        grid[2] += range(st, st + width)
        grid[3] += [*range(st, st + n), *[st - 1] * pad]
    return grid


def _ints(grid: list[list[int]]) -> torch.Tensor:
    """`grid`'s lists end to end as one int64 CPU tensor: by way of an array, half of
    torch.tensor's time on nested lists (5-29 us against 8-53 us for the compiled step's
    input of 1-8 rows x 1-5 tokens on a 2-core CPU)."""
    return torch.frombuffer(array("q", itertools.chain.from_iterable(grid)), dtype=torch.int64)


def _outer_head(
    head: Callable[[torch.Tensor], torch.Tensor], out: torch.Tensor,
    where: list[int] | range, lengths: list[int], last: bool,
) -> list[torch.Tensor]:  # fmt: skip
    """Logits of a compiled step that left its output head to the caller (compiled.py
    `CompiledForwards.outer_head`; `out`: (rows, T, H), the final norm's output): each
    row's last position (`last`, a prefill chunk: (1, V) each; the rows the eager lean
    decoder's head runs on, batch/decoder.py `kept_rows`) or every position of the rows
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
    step reads as one view, engine/compiled.py `_layer`), a filler row in each slot between
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
    repeated along the row (engine/compiled.py `_step` unpacks it)."""
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


_KEYS: dict[torch.device, torch.Tensor] = {}
_CPU = torch.device("cpu")  # where an eager step's masks are built
_FILLS: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}


def span_keys(span: int, device: torch.device) -> torch.Tensor:
    """arange(span) on `device`, sliced from one kept tensor per device (grown when a
    longer span comes): a compiled step's key span is this tensor's length."""
    keys = _KEYS.get(device)
    if keys is None or keys.shape[0] < span:
        n = max(span, 1024) if keys is None else max(span, 2 * keys.shape[0])
        keys = _KEYS[device] = torch.arange(n, device=device)
    return keys[:span]


_BASES: dict[torch.device, torch.Tensor] = {}


def slot_base(lo: int, device: torch.device) -> torch.Tensor:
    """A tensor of lo + 2 elements: how a compiled step learns its first row's slot lo as a
    size (a value would be data the graph cannot slice by; +2: torch specialises sizes 0
    and 1), sliced from one kept tensor per device."""
    base = _BASES.get(device)
    if base is None or base.shape[0] < lo + 2:
        base = _BASES[device] = torch.zeros(max(lo + 2, 64), dtype=torch.int8, device=device)
    return base[: lo + 2]


def _fill(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    fill = _FILLS.get(dtype)
    if fill is None:
        fill = _FILLS[dtype] = (
            torch.zeros((), dtype=dtype), torch.tensor(torch.finfo(dtype).min, dtype=dtype)
        )  # fmt: skip
    return fill


def _to(
    masks: torch.Tensor | dict[str, torch.Tensor], device: torch.device
) -> torch.Tensor | dict[str, torch.Tensor]:
    if isinstance(masks, dict):
        return {kind: m.to(device) for kind, m in masks.items()}
    return masks.to(device)


_FACTS: weakref.WeakKeyDictionary[Any, tuple[AttentionLayout, torch.dtype]] = (
    weakref.WeakKeyDictionary()
)


def model_layout(model: Any) -> tuple[AttentionLayout, torch.dtype]:
    """A model's attention layout (masks.py) and float dtype, read once (a model's `dtype`
    walks its parameters, ~10 us a call)."""
    try:
        facts = _FACTS.get(model)
        if facts is None:
            facts = _FACTS[model] = (attention_layout(model.config), _float_dtype(model))
    except TypeError:  # not weakly referenceable: read every time
        facts = (attention_layout(model.config), _float_dtype(model))
    return facts


def model_facts(model: Any) -> tuple[int | None, torch.dtype]:
    """A model whose layers all attend alike: its sliding window (None: full attention)
    and float dtype. Raises ValueError for a model whose layers differ, or attend in
    chunks (one mask cannot serve it)."""
    layout, dtype = model_layout(model)
    if layout.uniform not in ("full_attention", "sliding_attention"):
        raise ValueError("the layers attend in several ways: no one mask serves them")
    return layout.uniform_window, dtype


def _float_dtype(model: Any) -> torch.dtype:
    dtype = getattr(model, "dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32
