"""One target forward for many rows of a SlotCache: each row's own tokens, positions and mask.

Row r feeds tokens t_r,0..t_r,n-1 at positions length[r]..length[r]+n-1 (its committed
length onward). Rows are right-padded to the longest; position ids are each row's own; the
mask lets query j of row r see exactly positions 0..length[r]+j of its own slot (a sliding
or chunked layer sees fewer: masks.py builds one mask per kind of layer). A padded query
sees the row's committed positions only (its output is dropped). After the forward the
caller commits what it keeps by setting `cache.length[slot]`; nothing is copied or cropped.

The forward here is the model's own (transformers). A model may carry a faster way to run
some of its steps (`FastForward`, attached at load from outside the core); a step it does
not take runs here.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import weakref
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gateway.engine.backends.base import BackendCache
from gateway.engine.batch.masks import AttentionLayout, attention_layout, layer_masks
from gateway.engine.batch.slots import SlotCache

if TYPE_CHECKING:
    from gateway.engine.draft_head import DraftHead


@dataclass
class FeatureTap:
    """A step's request for the model's hidden states at every fed position, after the
    layers `layers` counts (0: the embeddings, i: after layer i), side by side: the forward
    fills `rows`, row r's (len(tokens[r]), len(layers) x H). What a feature-conditioned
    draft head reads (proposers/head.py); a step without a tap computes none of it."""

    layers: tuple[int, ...]
    rows: list[torch.Tensor] | None = None

    def fill(self, states: list[torch.Tensor] | tuple[torch.Tensor, ...], step: Step) -> None:
        """From the forward's hidden states ((B, T, H) each, index 0 the embeddings)."""
        feats = torch.cat([states[i] for i in self.layers], dim=-1)  # (B, T, taps x H)
        self.rows = [feats[r, : len(x)] for r, x in enumerate(step.tokens)]

    def of(self, row: int, layers: tuple[int, ...]) -> torch.Tensor:
        """Row `row`'s states after `layers` (a subset of the tap's), (t, len(layers) x H)."""
        if self.rows is None:
            raise RuntimeError("the forward did not fill its FeatureTap")
        feats = self.rows[row]
        if layers == self.layers:
            return feats
        width = feats.shape[-1] // len(self.layers)
        cols = [self.layers.index(i) for i in layers]
        return torch.cat([feats[:, c * width : (c + 1) * width] for c in cols], dim=-1)


@dataclass(frozen=True)
class Step:
    """One forward's rows: row r feeds `tokens[r]` into slot `slots[r]` of `cache`, from
    that slot's committed length on. What comes back: logits per row, (len(tokens[r]), V)
    each, or (1, V) of the last token with `keep_last`; with `backbone`, the last hidden
    states instead ((.., H), the output head skipped); with `head` (a draft's reduced
    head, draft_head.py), the logits through that head. With `tap`, the forward also
    fills the tap with the hidden states it asks for (FeatureTap)."""

    cache: SlotCache
    slots: list[int]
    tokens: list[list[int]]
    keep_last: bool = False
    backbone: bool = False
    head: DraftHead | None = None
    tap: FeatureTap | None = None
    prompt: bool = False  # prompt chunks (a prefill): a backend may use its prompt kernels
    trees: dict[int, list[int]] | None = None  # row -> its tree's parents (masks.py)

    @functools.cached_property
    def starts(self) -> list[int]:
        """Each row's first write position (its slot's committed length when the step is
        first asked: a step is made for one forward, right before it)."""
        return [self.cache.length[s] for s in self.slots]

    @functools.cached_property
    def span(self) -> int:
        """The key span of the step: the furthest position any row writes, plus one."""
        return max(st + len(x) for st, x in zip(self.starts, self.tokens, strict=True))

    def rows_of(self, out: torch.Tensor) -> list[torch.Tensor]:
        """`out` ((B, T or 1, ..), row r at index r) cut to each row's own positions."""
        return [out[r, : 1 if self.keep_last else len(x)] for r, x in enumerate(self.tokens)]


class FastForward(Protocol):
    """A faster way to run some of one model's steps, attached to its LoadedModel at load
    (gateway/speed/). It must give the logits `batched_forward` gives, within the rounding
    its docs state."""

    def __call__(self, model: Any, step: Step) -> list[torch.Tensor] | None:
        """The step's output (as `batched_forward`'s), or None: a step it does not take,
        which the model's own forward then runs. A step with a tap (FeatureTap) comes
        here only when the object says `taps = True`, and it must then fill the tap."""
        ...

    def slot_cache(self, layers: int, capacity: int) -> SlotCache | None:
        """An empty slot cache of the buffer shapes its steps were built for (the cost
        probe times steps on it), or None: any cache serves."""
        ...

    def describe(self) -> dict[str, Any]:
        """What it serves, as plain data (the kept forward costs are keyed by it)."""
        ...


@dataclass(frozen=True)
class EagerInputs:
    """A step's tensors for a forward of the whole model (on the model's device)."""

    ids: torch.Tensor  # (B, T) token ids, right-padded with 0
    position_ids: torch.Tensor  # (B, T)
    mask: torch.Tensor | dict[str, torch.Tensor] | None  # additive; one per kind of layer


def batched_forward(model: Any, step: Step, fast: FastForward | None = None) -> list[torch.Tensor]:
    """`step`'s output (see Step). Writes each row's tokens into its slot at length[slot]..
    (the caller commits). With `fast` (the LoadedModel's), the steps it takes run there; the
    others run the model's own forward."""
    cache = step.cache
    if isinstance(cache, BackendCache):  # a backend keeps the KV (engine/backends/base.py)
        if step.head is not None:
            raise ValueError("a backend's model has no reduced drafting head")
        if step.tap is not None:
            raise ValueError("a backend's model hands back no hidden states")
        if step.trees:
            raise ValueError("a backend's model verifies chains only, not trees")
        return cache.forward(
            step.slots, step.tokens, step.keep_last, logits=not step.backbone, prompt=step.prompt
        )
    t = max(len(x) for x in step.tokens)
    starts = step.starts
    if any(st + len(x) > cache.capacity for st, x in zip(starts, step.tokens, strict=True)):
        raise ValueError("a row would write past its slot's capacity")
    if max(starts) + t > cache.capacity + cache.pad:
        raise ValueError("a padded row would write past its slot's padding")
    if fast is not None and (step.tap is None or getattr(fast, "taps", False)):
        done = fast(model, step)
        if done is not None:
            return done
    inputs = eager_inputs(model, step)
    hidden = step.backbone or step.head is not None
    layout = model_layout(model)
    forward = backbone_of(model) if hidden else model
    res = forward(
        input_ids=inputs.ids,
        attention_mask=inputs.mask,
        position_ids=inputs.position_ids,
        use_cache=True,
        **({"output_hidden_states": True} if step.tap is not None else {}),
        **{layout.kwarg: cache},
    )
    if step.tap is not None:
        step.tap.fill(res.hidden_states, step)
    out = res.last_hidden_state if hidden else res.logits  # (B, T, H or V)
    if step.keep_last:
        out = torch.stack([out[r, len(x) - 1] for r, x in enumerate(step.tokens)])[:, None]
    return finish(out, step)


def finish(out: torch.Tensor, step: Step) -> list[torch.Tensor]:
    """A forward's output ((B, T or 1, H or V)) as the step's: through its draft head when
    it has one, cut to each row's positions."""
    if step.head is not None:
        out = step.head(out)  # (B, T or 1, V)
    return step.rows_of(out)


def eager_inputs(model: Any, step: Step) -> EagerInputs:
    """The step's inputs for a forward of the whole model, and the cache told where this
    step writes (slots.py `SlotCache.step_*`)."""
    cache, tokens, starts = step.cache, step.tokens, step.starts
    b, t = len(tokens), max(len(x) for x in tokens)
    facts = model_layout(model)
    device = facts.device
    empty = any(st == 0 and len(x) < t for st, x in zip(starts, tokens, strict=True))
    packed = int_tensor(row_layout(tokens, starts, t, step.trees)).view(4, b, t)
    ids, position_ids, positions, last_seen = packed[0], packed[1], packed[2], packed[3]
    trees = None
    if step.trees:
        trees = {r: (starts[r], parents) for r, parents in step.trees.items()}
    # One row feeding one token, every layer attending in full, sees its whole slot: no
    # mask needed (the fast SDPA path).
    mask: torch.Tensor | dict[str, torch.Tensor] | None = None
    if b > 1 or t > 1 or not facts.layout.all_full:
        zero, low = _fill(facts.dtype)
        keys = span_keys(step.span, _CPU)
        masks = layer_masks(facts.layout, last_seen, keys, empty, zero, low, trees)
        mask = _to(masks, device)
    if b == 1:
        cache.step_single = (step.slots[0], starts[0])
    else:
        slots = step.slots
        cache.step_single = None
        cache.step_rows = torch.tensor(slots, dtype=torch.long)[:, None].to(device)  # (B, 1)
        cache.step_positions = positions.to(device)
        lo = min(slots)
        cache.step_range = (lo, lo + b) if slots == list(range(lo, lo + b)) else None
    cache.step_span = step.span
    return EagerInputs(ids.to(device), position_ids.to(device), mask)


def backbone_of(model: Any) -> Any:
    """The model without its output head: its base model, or, for a family whose base
    model prefix names no submodule (Llama 4's text model), its `model`."""
    inner = model.base_model
    return model.model if inner is model else inner


def row_layout(
    tokens: list[list[int]], starts: list[int], width: int,
    trees: dict[int, list[int]] | None = None,
) -> list[list[int]]:  # fmt: skip
    """A step's inputs as four flat lists of len(tokens) x width, row by row: token ids
    right-padded with 0; position ids (a padded token's is its row's last real one: learned
    position tables end at the context length, and a padded output is dropped anyway);
    write positions (length onward); the last key each query sees (a padded query: the
    committed ones). Built as Python lists and turned into ONE tensor: a step's shaping
    used to be a dozen small torch ops, ~0.1 ms a forward."""
    grid: list[list[int]] = [[], [], [], []]
    for r, (row, st) in enumerate(zip(tokens, starts, strict=True)):
        n = len(row)
        pad = width - n
        grid[0] += [*row, *[0] * pad]
        parents = None if trees is None else trees.get(r)
        if parents is None:
            grid[1] += [*range(st, st + n), *[st + n - 1] * pad]
        else:  # a tree's node sits at its depth (masks.py `tree_visible` sees to the rest)
            depth = [0]
            for par in parents:
                depth.append(depth[par + 1] + 1)
            grid[1] += [st + d for d in depth] + [st + depth[-1]] * pad
        grid[2] += range(st, st + width)
        grid[3] += [*range(st, st + n), *[st - 1] * pad]
    return grid


def int_tensor(grid: list[list[int]]) -> torch.Tensor:
    """`grid`'s lists end to end as one int64 CPU tensor, by way of an array (about half
    of torch.tensor's time on nested lists)."""
    return torch.frombuffer(array("q", itertools.chain.from_iterable(grid)), dtype=torch.int64)


_KEYS: dict[torch.device, torch.Tensor] = {}
_CPU = torch.device("cpu")  # where an eager step's masks are built
_FILLS: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}


def span_keys(span: int, device: torch.device) -> torch.Tensor:
    """arange(span) on `device`, sliced from one kept tensor per device (grown when a
    longer span comes)."""
    keys = _KEYS.get(device)
    if keys is None or keys.shape[0] < span:
        n = max(span, 1024) if keys is None else max(span, 2 * keys.shape[0])
        keys = _KEYS[device] = torch.arange(n, device=device)
    return keys[:span]


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


@dataclass(frozen=True)
class ModelFacts:
    """What a step needs to know of a model, read once (a model's `dtype` walks its
    parameters on every call)."""

    layout: AttentionLayout  # masks.py
    dtype: torch.dtype  # its float dtype
    device: torch.device
    kwarg: str  # its forward's KV-cache argument (models.py `cache_kwarg`)


_FACTS: weakref.WeakKeyDictionary[Any, ModelFacts] = weakref.WeakKeyDictionary()


def model_layout(model: Any) -> ModelFacts:
    """`model`'s facts (ModelFacts), read once per model."""
    try:
        facts = _FACTS.get(model)
        if facts is None:
            facts = _FACTS[model] = _read_facts(model)
    except TypeError:  # not weakly referenceable: read every time
        facts = _read_facts(model)
    return facts


def _read_facts(model: Any) -> ModelFacts:
    params = inspect.signature(model.forward).parameters
    return ModelFacts(
        layout=attention_layout(model.config),
        dtype=_float_dtype(model),
        device=next(model.parameters()).device,
        kwarg="cache" if "cache" in params else "past_key_values",
    )


def _float_dtype(model: Any) -> torch.dtype:
    dtype = getattr(model, "dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32
