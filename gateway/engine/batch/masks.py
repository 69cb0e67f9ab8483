"""Which keys each layer's queries see: a model's attention layout and one step's masks.

A decoder layer attends in one of three ways (transformers' `layer_types`):

- full: query at position p sees keys 0..p;
- sliding: keys p - window + 1..p (Mistral, Phi-3, and the local layers of Gemma 2/3,
  Cohere 2 and gpt-oss, which alternate them with full layers);
- chunked: keys of p's own chunk of `chunk` positions, up to p (Llama 4's local layers).

A step on a slot cache (forward.py) builds one additive mask per kind present and hands the
model a tensor when every layer attends alike, else a mapping kind -> mask, which the
families with mixed layers read per layer. A model whose layers attend in any other way
(recurrent, compressed, indexed attention) cannot be served from a slot cache of keys and
values: `attention_layout` refuses it, naming the layer type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gateway.engine.errors import UnsupportedModel

FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"
KINDS = (FULL, SLIDING, CHUNKED)


class UnsupportedAttention(UnsupportedModel):
    """A model whose layers attend in a way a slot cache of keys and values cannot serve."""


@dataclass(frozen=True)
class AttentionLayout:
    """Per layer, how its queries attend; the sliding window and the chunk size, where
    some layer uses them."""

    kinds: tuple[str, ...]
    window: int | None = None
    chunk: int | None = None

    @property
    def uniform(self) -> str | None:
        """The one kind every layer attends with, or None when they differ."""
        return self.kinds[0] if len(set(self.kinds)) == 1 else None

    @property
    def all_full(self) -> bool:
        return self.uniform == FULL

    @property
    def uniform_window(self) -> int | None:
        """The window when every layer slides; None when every layer attends in full.
        Callers that build one mask for every layer must check `uniform` first."""
        return self.window if self.uniform == SLIDING else None


def attention_layout(config: Any) -> AttentionLayout:
    """The layout a model's config declares: its `layer_types` where it has them, else
    every layer sliding when it has a `sliding_window` (and `use_sliding_window` is not
    False), else every layer full. Raises UnsupportedAttention for a layer type outside
    KINDS, or a sliding or chunked layer without its size."""
    layers = int(config.num_hidden_layers)
    declared = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    chunk = getattr(config, "attention_chunk_size", None)
    if declared is None:
        slides = window is not None and getattr(config, "use_sliding_window", True) is not False
        kinds = (SLIDING if slides else FULL,) * layers
    else:
        kinds = tuple(str(k) for k in list(declared)[:layers])
    odd = sorted({k for k in kinds if k not in KINDS})
    if odd:
        raise UnsupportedAttention(
            f"{getattr(config, 'model_type', '?')}: layers of type {', '.join(odd)} keep a "
            "state other than keys and values; this engine serves full, sliding-window and "
            "chunked attention only"
        )
    if SLIDING in kinds and not isinstance(window, int):
        raise UnsupportedAttention("sliding-window layers without a `sliding_window` size")
    if CHUNKED in kinds and not isinstance(chunk, int):
        raise UnsupportedAttention("chunked-attention layers without an `attention_chunk_size`")
    return AttentionLayout(
        kinds, window if SLIDING in kinds else None, chunk if CHUNKED in kinds else None
    )


def visible(
    last_seen: torch.Tensor, keys: torch.Tensor, window: int | None, empty: bool,
    chunk: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """(B, 1, T, S) bool: query j of row r sees keys 0..last_seen[r, j] of its own slot
    (inside the sliding window; inside its chunk); `keys` is arange(S). `empty`: a query
    that sees no committed key (last_seen < 0, a padded query of an empty row) sees key 0:
    no NaN. A query always sees its own key, so no other query is ever left without one."""
    seen = last_seen[:, None, :, None]  # (B, 1, T, 1)
    sees = keys <= seen  # (B, 1, T, S)
    if window is not None:
        sees &= keys > seen - window
    if chunk is not None:
        sees &= torch.div(keys, chunk, rounding_mode="floor") == torch.div(
            seen, chunk, rounding_mode="floor"
        )
    if empty:
        sees |= (seen < 0) & (keys == 0)
    return sees


def tree_visible(
    start: int, parents: list[int], keys: torch.Tensor, width: int, window: int | None,
    chunk: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """(width, S) bool for one row feeding a token tree (tree_verifier.py) from write
    position `start`: the root (the last committed token) at `start`, node i at start + 1 + i,
    each at position start + its depth (forward.py gives it that position id). Query j sees
    the committed keys 0..start-1 and its own ancestors (itself included) in the tree, with
    the window and the chunk taken on positions, not write positions; a padded query (j past
    the tree) sees the committed keys and the root (its output is dropped)."""
    n = len(parents)
    depth = [0]
    anc = torch.zeros(width, n + 1, dtype=torch.bool)  # query row x tree row
    anc[0, 0] = True
    for i, par in enumerate(parents):
        depth.append(depth[par + 1] + 1)
        anc[i + 1] = anc[par + 1]
        anc[i + 1, i + 1] = True
    span = keys.shape[0]
    d = torch.tensor(depth, dtype=torch.long)
    key_pos = keys.clone()
    key_pos[start : start + n + 1] = start + d[: max(0, min(n + 1, span - start))]
    query_pos = torch.full((width,), start - 1, dtype=torch.long)
    query_pos[: n + 1] = start + d
    sees = (keys < start)[None, :].expand(width, span).clone()  # (T, S)
    sees[:, start : start + n + 1] = anc
    qp = query_pos[:, None]
    if window is not None:
        sees &= key_pos[None, :] > qp - window
    if chunk is not None:
        sees &= torch.div(key_pos, chunk, rounding_mode="floor")[None, :] == torch.div(
            qp, chunk, rounding_mode="floor"
        )
    sees[n + 1 :, start] = True  # a padded query sees the root too: never a row of no key
    return sees


def additive(sees: torch.Tensor, zero: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """`sees` as an additive mask: `zero` where a query sees, `low` where it does not."""
    return torch.where(sees, zero, low)


def layer_masks(
    layout: AttentionLayout, last_seen: torch.Tensor, keys: torch.Tensor, empty: bool,
    zero: torch.Tensor, low: torch.Tensor,
    trees: dict[int, tuple[int, list[int]]] | None = None,
) -> torch.Tensor | dict[str, torch.Tensor]:  # fmt: skip
    """One step's masks: a tensor when every layer attends alike, else kind -> tensor for
    each kind present (what transformers' families with mixed layers take). `trees`: the
    rows feeding a token tree, row -> (start, parents) (`tree_visible`)."""
    sizes = {FULL: (None, None), SLIDING: (layout.window, None), CHUNKED: (None, layout.chunk)}
    masks: dict[str, torch.Tensor] = {}
    width = last_seen.shape[1]
    for kind in dict.fromkeys(layout.kinds):
        window, chunk = sizes[kind]
        sees = visible(last_seen, keys, window, empty, chunk)
        for r, (start, parents) in (trees or {}).items():
            sees[r, 0] = tree_visible(start, parents, keys, width, window, chunk)
        masks[kind] = additive(sees, zero, low)
    return next(iter(masks.values())) if len(masks) == 1 else masks
