"""One target forward for many rows of a SlotCache: each row's own tokens, positions and mask.

Row r feeds tokens t_r,0..t_r,n-1 at positions length[r]..length[r]+n-1 (its committed
length onward). Rows are right-padded to the longest; position ids are each row's own; the
mask lets query j of row r see exactly positions 0..length[r]+j of its own slot (sliding
window models also hide positions older than the window). A padded query sees the row's
committed positions only (its output is dropped). After the forward the caller commits
what it keeps by setting `cache.length[slot]`; nothing is copied or cropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from gateway.engine.batch.slots import SlotCache
from gateway.engine.compiled import CompiledForwards

if TYPE_CHECKING:
    from gateway.engine.batch.decoder import LeanDecoder


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
) -> list[torch.Tensor]:
    """Logits per row: (len(tokens[r]), V) each, or (1, V) of the last token with keep_last;
    with backbone, the last hidden states instead ((.., H), the output head skipped).
    Writes each row's tokens into its slot at length[slot].. (the caller commits). With
    `compiled`, the model's compiled step runs the steps it was built for (engine/compiled.py);
    the others run `decoder`, the lean forward (batch/decoder.py: the same logits as the
    model's forward, less overhead), or without one the model's own forward."""
    b, t = len(slots), max(len(x) for x in tokens)
    starts = [cache.length[s] for s in slots]
    if any(st + len(x) > cache.capacity for st, x in zip(starts, tokens, strict=True)):
        raise ValueError("a row would write past its slot's capacity")
    if any(st + t > cache.capacity + cache.pad for st in starts):
        raise ValueError("a padded row would write past its slot's padding")
    ids = torch.tensor([row + [0] * (t - len(row)) for row in tokens])  # (B, T), right-padded
    start = torch.tensor(starts, dtype=torch.long)  # (B,)
    positions = start[:, None] + torch.arange(t)[None, :]  # (B, T) write positions
    # A padded token's position id is its row's last real one (learned position tables end
    # at the context length; a padded output is dropped anyway).
    last = torch.tensor([st + len(x) - 1 for st, x in zip(starts, tokens, strict=True)])
    position_ids = torch.minimum(positions, last[:, None])  # (B, T)
    span = max(st + len(row) for st, row in zip(starts, tokens, strict=True))
    window = _sliding_window(model)
    lengths = [len(x) for x in tokens]
    dtype = _float_dtype(model)
    if compiled is not None and compiled.serves(b, t, keep_last, backbone) and cache.allocated:
        out = compiled(
            ids.to(device),
            _mask(positions, start, lengths, span, window, dtype).to(device),
            position_ids.to(device),
            torch.tensor(slots, device=device),
            positions.to(device),
            cache,
            torch.tensor(lengths, device=device) - 1,
        )  # fmt: skip  (B, T or 1, H or V)
        return [out[r, : 1 if keep_last else n] for r, n in enumerate(lengths)]
    # One row feeding one token sees its whole slot: no mask needed (the fast SDPA path).
    mask = None
    if b > 1 or t > 1 or window is not None:
        mask = _mask(positions, start, lengths, span, window, dtype)
    if b == 1:
        cache.step_single = (slots[0], starts[0])
    else:
        cache.step_single = None
        cache.step_rows = torch.tensor(slots, dtype=torch.long)[:, None].to(device)  # (B, 1)
        cache.step_positions = positions.to(device)
        lo = min(slots)
        cache.step_range = (lo, lo + b) if slots == list(range(lo, lo + b)) else None
    cache.step_span = span
    if decoder is not None:
        keep = [n - 1 for n in lengths] if keep_last else None
        out = decoder(
            ids.to(device),
            None if mask is None else mask.to(device),
            position_ids.to(device),
            cache,
            keep=keep,
            backbone=backbone,
        )  # fmt: skip  (B, T or 1, H or V)
        return [out[r, : 1 if keep_last else n] for r, n in enumerate(lengths)]
    forward = model.base_model if backbone else model
    out = forward(
        input_ids=ids.to(device),
        attention_mask=None if mask is None else mask.to(device),
        position_ids=position_ids.to(device),
        use_cache=True,
        **{kwarg: cache},
    )
    logits = out.last_hidden_state if backbone else out.logits  # (B, T, H or V)
    if keep_last:
        return [logits[r, len(x) - 1 : len(x)] for r, x in enumerate(tokens)]
    return [logits[r, : len(x)] for r, x in enumerate(tokens)]


def _mask(
    positions: torch.Tensor, start: torch.Tensor, lengths: list[int], span: int,
    window: int | None, dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """(B, 1, T, S) additive: query j of row r sees keys 0..start[r] + j of its own slot (a
    padded query j >= n_r sees the committed keys only), inside the sliding window."""
    t = positions.shape[1]
    n = torch.tensor(lengths, dtype=torch.long)  # (B,)
    last_seen = torch.where(torch.arange(t)[None, :] < n[:, None], positions, start[:, None] - 1)
    keys = torch.arange(span)  # (S,)
    visible = keys[None, None, :] <= last_seen[:, :, None]  # (B, T, S)
    if window is not None:
        visible &= keys[None, None, :] > last_seen[:, :, None] - window
    visible |= (last_seen < 0)[:, :, None] & (keys == 0)[None, None, :]  # empty row: no NaN
    mask = torch.zeros((positions.shape[0], 1, t, span), dtype=dtype)
    return mask.masked_fill_(~visible[:, None], torch.finfo(dtype).min)


def _sliding_window(model: Any) -> int | None:
    cfg = getattr(model, "config", None)
    window = getattr(cfg, "sliding_window", None)
    if window is None or getattr(cfg, "use_sliding_window", True) is False:
        return None
    return int(window)


def _float_dtype(model: Any) -> torch.dtype:
    dtype = getattr(model, "dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32
