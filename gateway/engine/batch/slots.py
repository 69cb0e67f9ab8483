"""A KV cache of fixed slots: one row per request, each with its own committed length.

Layout per layer: keys and values of shape (slots, kv_heads, capacity, head_dim), allocated
on the first forward. Slot s holds its request's committed tokens at positions
0..length[s]-1. A forward writes the new tokens of each row at positions length[s]..,
and the attention mask (built by `batched_forward`) lets each query see only its own
row's positions up to itself, so:

- rows of different lengths share one forward without padding their caches;
- rolling back rejected draft tokens is lowering `length[s]` (the stale entries past it
  are never attended and are overwritten by the next forward): no cropping, no copies;
- a row joins by taking a free slot and leaves by freeing it.

The buffers are pre-allocated and a step's shapes are (rows, tokens) with rows <= slots:
a layout that a faster forward built for fixed buffer sizes can follow too (gateway/speed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from gateway.limits import MAX_K

Buffers = tuple[list[torch.Tensor], list[torch.Tensor]]  # every layer's keys, values
PREFILL_CHUNK = 128  # prompt tokens a batch step prefills at most per row (scheduler.py)
PREFILL_BUDGET = 512  # prompt tokens a step's prefill forward feeds at most, all rows together


def slot_pad(prefill_chunk: int = PREFILL_CHUNK) -> int:
    """Positions past a slot's capacity where a padded row's filler may land: a step
    right-pads rows to the longest feed (1 + k <= 1 + MAX_K, or a prefill chunk). Never
    under the default chunk's, so that a smaller chunk keeps the buffers' shape (which a
    faster forward may be built for, gateway/speed)."""
    return max(MAX_K + 1, prefill_chunk, PREFILL_CHUNK)


@dataclass(frozen=True)
class Saved:
    """One slot's committed keys and values, per layer (kv_heads, length, head_dim), outside
    the buffers (`SlotCache.save`, `restore`)."""

    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


class SlotLayer(CacheLayerMixin):
    """One attention layer's slot buffers; `update` writes where the cache says."""

    is_compileable = False
    is_croppable = False

    def __init__(self, owner: SlotCache) -> None:
        super().__init__()
        self._owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        o = self._owner
        _, heads, _, dim = key_states.shape  # (B, H, T, D)
        shape = (o.slots, heads, o.capacity + o.pad, dim)
        self.keys = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
        vdim = value_states.shape[-1]
        vshape = (o.slots, heads, o.capacity + o.pad, vdim)
        self.values = torch.zeros(vshape, dtype=value_states.dtype, device=value_states.device)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None
        o = self._owner
        span = o.step_span
        if o.step_single is not None:  # one row: a plain slice copy
            slot, start = o.step_single
            end = start + key_states.shape[2]
            self.keys[slot, :, start:end] = key_states[0]  # (H, T, D)
            self.values[slot, :, start:end] = value_states[0]
            return self.keys[slot : slot + 1, :, :span], self.values[slot : slot + 1, :, :span]
        rows, pos = o.step_rows, o.step_positions  # (B, 1), (B, T)
        self.keys[rows, :, pos] = key_states.transpose(1, 2)  # (B, T, H, D) into the slots
        self.values[rows, :, pos] = value_states.transpose(1, 2)
        if o.step_range is not None:  # contiguous rows: views, no copy
            a, b = o.step_range
            return self.keys[a:b, :, :span], self.values[a:b, :, :span]
        index = rows[:, 0]
        return self.keys[index, :, :span], self.values[index, :, :span]  # (B, H, span, D)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._owner.step_span, 0

    def get_seq_length(self) -> int:
        return self._owner.step_span

    def get_max_length(self) -> int:
        return self._owner.capacity


class SlotCache(Cache):
    """`slots` rows of up to `capacity` tokens each, for `layers` attention layers, plus `pad`
    positions past the capacity where a padded row's filler tokens may land (never read)."""

    parkable = True  # a slot can be saved out of the buffers and restored (`save`, `restore`)

    def __init__(self, layers: int, slots: int, capacity: int, pad: int = 0) -> None:
        self.slots = slots
        self.capacity = capacity
        self.pad = pad
        self.length = [0] * slots  # committed tokens in each slot
        self.free = list(range(slots - 1, -1, -1))
        # Set by batched_forward for the duration of one forward:
        self.step_rows = torch.zeros((0, 1), dtype=torch.long)  # (B, 1) slot of each row
        self.step_positions = torch.zeros((0, 0), dtype=torch.long)  # (B, T) write positions
        self.step_range: tuple[int, int] | None = None
        self.step_span = 0  # keys returned: positions 0..span-1
        self.step_single: tuple[int, int] | None = None  # (slot, start) of a one-row step
        self._buffers: Buffers | None = None
        super().__init__(layers=[SlotLayer(self) for _ in range(layers)])

    def take(self) -> int:
        """The lowest free slot (its length reset to 0), so that rows fill slots 0, 1, ...
        in a batch that keeps them packed (`move`); raises IndexError when all are taken."""
        if not self.free:
            raise IndexError("every slot is taken")
        slot = min(self.free)
        self.free.remove(slot)
        self.length[slot] = 0
        return slot

    def move(self, src: int, dst: int) -> None:
        """Slot src's committed keys and values (its length) into slot dst, a free one;
        src is then free. Before the first forward there is nothing to copy."""
        n = self.length[src]
        self.copy_prefix(src, dst, n)
        self.length[dst], self.length[src] = n, 0

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Slot src's keys and values at positions 0..n-1 into slot dst (lengths untouched:
        batch/prefix.py, which lends kept prompt prefixes, sets them)."""
        if n <= 0 or not self.allocated:
            return
        keys, values = self.buffers()
        with torch.inference_mode():  # a cancel moves rows between steps
            for buffer in (*keys, *values):
                buffer[dst, :, :n] = buffer[src, :, :n]

    def gather(self, slot: int, start: int, sources: list[int]) -> None:
        """Keys and values of `slot` at positions `sources` (increasing, each >= its
        destination) into positions start, start + 1, ...: a verified tree's accepted path
        made contiguous (its nodes were written at their feed's positions)."""
        if not sources or not self.allocated or sources == list(range(start, start + len(sources))):
            return
        keys, values = self.buffers()
        src = torch.tensor(sources, dtype=torch.long, device=keys[0].device)
        with torch.inference_mode():
            for buffer in (*keys, *values):
                buffer[slot, :, start : start + len(sources)] = buffer[slot, :, src]

    def reusable(self, slot: int, n: int) -> int:
        """Of slot's first n positions, how many a kept prefix may lend (all of them here; a
        backend whose prompt and decode kernels differ lends the prompt's only)."""
        return n

    def release(self, slot: int) -> None:
        self.length[slot] = 0
        self.free.append(slot)

    def save(self, slot: int) -> Saved:
        """A copy of slot's committed keys and values (positions 0..length-1), taken out of
        the buffers: what a parked row keeps while another takes its slot."""
        if not self.parkable:
            raise NotImplementedError(f"{type(self).__name__} cannot save a slot")
        n = self.length[slot]
        if n == 0 or not self.allocated:
            return Saved(n, [], [])
        keys, values = self.buffers()
        with torch.inference_mode():
            return Saved(n, [k[slot, :, :n].clone() for k in keys],
                         [v[slot, :, :n].clone() for v in values])  # fmt: skip

    def restore(self, slot: int, saved: Saved) -> None:
        """Put a saved copy into `slot` (a taken one), bit for bit, and set its length. A
        cache no forward has built yet (a batch made anew) is built from the copy's shape."""
        if saved.length and not saved.keys:
            raise RuntimeError("a saved slot's keys and values are missing")
        if saved.keys:
            if not self.allocated:
                layers = [layer for layer in self.layers if isinstance(layer, SlotLayer)]
                for layer, k, v in zip(layers, saved.keys, saved.values, strict=True):
                    layer.lazy_initialization(k[None], v[None])
            keys, values = self.buffers()
            with torch.inference_mode():
                for buffer, part in zip((*keys, *values), (*saved.keys, *saved.values),
                                        strict=True):  # fmt: skip
                    buffer[slot, :, : saved.length] = part
        self.length[slot] = saved.length

    @property
    def allocated(self) -> bool:
        """Whether the buffers exist (they are allocated by the first forward)."""
        return self._buffers is not None or all(
            isinstance(layer, SlotLayer) and layer.is_initialized for layer in self.layers
        )

    def buffers(self) -> Buffers:
        """Every layer's key and value buffers (slots, kv_heads, capacity + pad, D); listed
        once, since they never move after the first forward (a faster forward may ask for
        them on every step)."""
        buffers = self._buffers
        if buffers is None:
            layers = [layer for layer in self.layers if isinstance(layer, SlotLayer)]
            keys = [layer.keys for layer in layers]
            values = [layer.values for layer in layers]
            assert all(x is not None for x in keys + values), "no forward has run yet"
            buffers = self._buffers = cast(Buffers, (keys, values))
        return buffers

    @property
    def in_use(self) -> int:
        return self.slots - len(self.free)

    def bytes_per_token(self) -> int:
        """KV bytes one cached token takes over all layers (0 before the first forward)."""
        total = 0
        for layer in self.layers:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t[0, :, 0].numel() * t.element_size()
        return total
