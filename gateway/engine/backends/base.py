"""The seam between the batch path and a model backend that keeps its own KV memory.

The batch path (batch/scheduler.py, batch/drafting.py, batch/costs.py) runs every forward
through `batched_forward` on a SlotCache: slot s holds its row's committed tokens at
positions 0..length[s]-1, a forward writes each row's new tokens at length[s].., the caller
commits what it keeps by setting length[s] (rolling back rejected draft tokens is lowering
it), a kept prompt prefix moves between slots by `copy_prefix`, and a leaving row's slot
by `move`.

A backend whose keys and values live in its own memory (llama.cpp's sequences:
backends/llamacpp.py) keeps exactly that contract with a `BackendCache`: a SlotCache with
no torch buffers whose `forward` runs the backend's forward for the rows' slots and whose
`copy_prefix` copies in the backend's memory. The slots' lengths stay the truth; what the
backend holds past a slot's length (a rejected draft, a previous row's tokens) is dropped
before the next forward writes there. So the loop, verifier, proposers, grammars, sampling,
logprobs, stop handling, k choice and kept prefixes run unchanged on top of it.

A model object that has a `slot_cache(slots, capacity, pad)` method is such a backend's
model (`BackendModel`); `slot_cache` below builds the cache the batch path uses for any
model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from gateway.engine.batch.slots import SlotCache
from gateway.engine.schema import Delta, Finished

if TYPE_CHECKING:
    from gateway.engine.batch.scheduler import Batch
    from gateway.engine.loop import LoopConfig


class BackendCache(SlotCache):
    """Slots whose keys and values a backend keeps (no torch buffers, no layers)."""

    parkable = False  # `save`/`restore` of a slot: not for a backend's memory (yet)

    def __init__(self, slots: int, capacity: int, pad: int = 0) -> None:
        super().__init__(0, slots, capacity, pad)

    @property
    def allocated(self) -> bool:
        """The backend's memory exists from the start (kept prefixes may be noted at once)."""
        return True

    def forward(
        self, slots: list[int], tokens: list[list[int]], keep_last: bool, logits: bool = True,
        prompt: bool = False,
    ) -> list[torch.Tensor]:  # fmt: skip
        """Row r's tokens written at positions length[slots[r]].. of its slot (the caller
        commits); logits per row: (len(tokens[r]), V), or (1, V) of the last token with
        keep_last. With logits=False nothing is read back (a draft's prefill): empty
        (0, V) tensors. `prompt`: the rows feed prompt chunks (a prefill), which a backend
        may compute with other kernels than decode steps, the same for every chunking."""
        raise NotImplementedError

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Slot src's entries at positions 0..n-1 into slot dst (lengths untouched)."""
        raise NotImplementedError


@runtime_checkable
class BackendModel(Protocol):
    """A model served by a backend: it builds the caches its forwards run on."""

    def slot_cache(self, slots: int, capacity: int, pad: int = 0) -> BackendCache: ...


def slot_cache(model: Any, slots: int, capacity: int, pad: int = 0) -> SlotCache:
    """The cache the batch path runs `model` on: its backend's (`BackendModel`), or torch
    slot buffers for a transformers model."""
    if isinstance(model, BackendModel):
        return model.slot_cache(slots, capacity, pad)
    return SlotCache(int(model.config.num_hidden_layers), slots, capacity, pad)


def decode_alone(
    batch: Batch, cfg: LoopConfig, cancelled: Callable[[], bool] | None
) -> Iterator[Delta | Finished]:
    """One request on a batch of its own (a backend's model decodes through the batch path
    only; Engine.stream runs it here): its events as loop.decode yields them."""
    batch.add(cfg, cancelled)
    while batch.rows:
        for _, events in batch.step():
            for e in events:
                if isinstance(e, Exception):
                    raise e
                yield e
