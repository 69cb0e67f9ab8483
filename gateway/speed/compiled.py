"""A compiled decode step for the batch path: torch.compile (inductor) over the lean decoder
(speed/lean.py), writing into and reading from the slot cache of batch/slots.py.

Why: at the demo sizes an eager step is mostly per-op overhead; inductor fuses the norms,
rotary embeddings, activations, residuals (and in a one-token step on a CPU the attention's
softmax) around the matrix products and runs a layer as a few generated kernels. The
lean decoder is what is compiled, not transformers' model forward: it is a plain function
of tensors (its cache writes are index_put_ into the pre-allocated slot buffers, its reads
a gather of the step's rows up to the key span), so it traces into one graph without
breaks, and compiles several times faster. Each layer is a nested compile region
(`_layer`): traced and compiled once per kind of step and reused by the other layers,
which halves a cold compile of the demo target.

Which steps: decode and verify steps of the target (each row's logits at every fed
position) and drafting steps of a draft (the last position's logits, or hidden states for
a reduced head), up to MAX_TOKENS tokens a row; and prefill chunks of up to MAX_PREFILL
tokens a row, through the same graphs (`CompiledForwards.serves`). A batch's first forward
(which allocates its slot buffers) and longer chunks run the eager lean decoder.

Shapes: dynamic, so a handful of graphs cover every step: torch specialises sizes of 1,
so the kinds are one row x one token, one row x several tokens, several rows x one,
several x several. The slot buffers' sizes are constants (`_step_of`): a step is built for
one batch shape (`batch_buffers`). Whether the one-row one-token kind pays depends on the
CPU (eager reads the row's cache as a view with no mask, the compiled step gathers and
masks; `python -m benchmarks engine_compiled` compares them), so GATEWAY_COMPILE=auto
measures each kind and keeps the faster. `warm_up`
compiles them at start, before the gateway says it is ready; with a store (`Precompiled`)
a restart loads them instead of tracing them again.

Exactness: fused kernels compute the same math in another order, so logits may differ from
eager in the last bits and a greedy choice may part at a near tie;
tests/unit/speed/test_compiled.py compares greedy outputs with eager ones, and
`python -m benchmarks engine_compiled` counts partings on the held-out prompts.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gateway.engine.batch.forward import model_layout
from gateway.engine.batch.slots import SlotCache
from gateway.speed.kinds import HEAD_SHARE, INDUCTOR, KINDS, MAX_PREFILL, MAX_TOKENS, kind
from gateway.speed.lean import Attend, Family, Joined, attention_extra, block
from gateway.speed.steps import step_mask
from gateway.speed.store import Precompiled, fingerprint_of, static_layout, tracing

if TYPE_CHECKING:
    from gateway.engine.draft_head import DraftHead
    from gateway.speed.graphs import GraphedSteps
    from gateway.speed.lean import LeanDecoder

log = logging.getLogger("gateway.speed.compiled")


@dataclass(frozen=True)
class CompiledForwards:
    """A model's compiled step, built for one use: `keep_last` (a draft's drafting step:
    the last position only) or every position (the target's verify step); `head`: a
    draft's reduced head (draft_head.py), run inside the step's graph."""

    step: Callable[..., torch.Tensor]
    keep_last: bool
    head: DraftHead | None = None
    kinds: frozenset[str] = KINDS
    """The kinds of step (`kind`) served compiled; GATEWAY_COMPILE=auto keeps those where
    the compiled step measured faster than eager (`measure_kinds`)."""
    graphs: GraphedSteps | None = None
    """On CUDA: the step padded to buckets and replayed as captured graphs (graphs.py)."""
    buffers: tuple[int, int] | None = None
    """(slots, positions) of the slot buffers the step was compiled for (a batch's rows,
    its context plus pad; `batch_buffers`): the compiled step takes their sizes as
    constants, so a cache of another shape compiles anew (`slot_cache` makes one of these)."""
    contiguous: bool = False
    """Whether the step's several-token kinds read the rows' keys and values as one view of
    the slot buffers (`_layer`): the rows must then be slots lo, lo + 1, ... in order
    (steps.py `contiguous_rows` arranges them, with filler rows in the gaps)."""
    prefill_all: bool = False
    """Whether this target step (every position) serves prefill chunks too (`serves`):
    set where its output head is small against its layers (`cheap_head`)."""
    outer_head: Callable[[torch.Tensor], torch.Tensor] | None = None
    """A target's output head (its forward), where the step's several-token kinds leave it
    to the caller (steps.py): they return the final norm's output, and the caller
    multiplies the positions it keeps, every one of a verify step's, each row's last of a
    prefill chunk's. Why: inside the graph a chunk would compute the head at every position,
    a sixth of its products on the demo target (the head is 2.1M of its 12.3M weights a
    token). Inside the graph the head of several rows would be the op gateway::linear_rows
    too (an extern kernel), so a verify step's logits are the same products either way.
    One-token kinds keep it inside, as a generated reduction, which measured several times
    cheaper than the op on one row. Not with captured graphs (`graphs`)."""

    def slot_cache(self, layers: int, capacity: int) -> SlotCache:
        """An empty slot cache of the buffers this step was compiled for (`buffers`), each
        slot holding `capacity` tokens (the model's context) and the rest as pad: the warm-up
        and the cost probe (batch/costs.py) run on one."""
        assert self.buffers is not None
        slots, positions = self.buffers
        return SlotCache(layers, slots, capacity, pad=positions - capacity)

    def serves(
        self, rows: int, tokens: int, keep_last: bool, backbone: bool, head: DraftHead | None
    ) -> bool:
        """Whether this step runs compiled: a step of the use it was built for (logits, of
        the last position with keep_last, through `head` if any), up to MAX_TOKENS tokens a
        row, and of a kind it serves (`kinds`); and a prefill chunk (keep_last) of up to
        MAX_PREFILL tokens a row, a target's too: its verify step returns every position,
        of which the caller keeps each row's last (`prefills_all`).

        Why prefill chunks: an eager forward's elementwise work (norms, rotary, residuals,
        activations) is a large share of a chunk's time at the demo sizes; fused, the
        demo target's prefill chunks measured faster compiled than eager, every
        position's logits included. A target's
        step does so only with `prefill_all` (its head small against its layers). Its keys
        and values round as the compiled step's: outputs may part from the eager gateway's
        at a near tie, as a compiled verify step's may (`python -m benchmarks
        engine_compiled` counts partings)."""
        if backbone or head is not self.head or kind(rows, tokens) not in self.kinds:
            return False
        if keep_last and tokens <= MAX_PREFILL:
            return self.keep_last or self.prefill_all
        return keep_last == self.keep_last and tokens <= MAX_TOKENS

    def prefills_all(self, keep_last: bool) -> bool:
        """Whether a keep_last call runs this step's every-position form (a target's)."""
        return keep_last and not self.keep_last

    def __call__(
        self, inputs: torch.Tensor, span: torch.Tensor, base: torch.Tensor, cache: SlotCache
    ) -> torch.Tensor:
        """inputs: (6, B, T), steps.py `step_layout`; span: arange(S), S the key
        span (batch/forward.py `span_keys`); base: a tensor of lo + 2 elements, lo the first
        row's slot (steps.py `slot_base`; read by a `contiguous` step only)."""
        keys, values = cache.buffers()
        return self.step(inputs, span, base, keys, values)


@dataclass(frozen=True)
class StepForm:
    """What one compiled step is built for, fixed when it is made (`compile_forwards`):
    the lean decoder, the use (`keep_last`, a draft's `head`), the model's sliding window
    and dtype (`model_facts`), whether several-token kinds read the rows'
    keys as one view (`contiguous`, see `_layer`) and leave the output head to the caller
    (`head_outside`, `CompiledForwards.outer_head`)."""

    lean: LeanDecoder
    keep_last: bool
    head: DraftHead | None
    window: int | None
    dtype: torch.dtype
    contiguous: bool
    head_outside: bool


def _step_of(form: StepForm) -> Callable[..., torch.Tensor]:
    """The step of `form` as a function of tensors (`step`, below). The form's fields are
    its closure's cells, so what torch traces is plain values and modules."""
    lean, keep_last, head, window = form.lean, form.keep_last, form.head, form.window
    dtype, contiguous, head_outside = form.dtype, form.contiguous, form.head_outside

    def step(
        inputs: torch.Tensor, span: torch.Tensor, base: torch.Tensor,
        keys: list[torch.Tensor], values: list[torch.Tensor],
    ) -> torch.Tensor:  # fmt: skip
        """The lean decoder's layers as one function of tensors. inputs: (6, B, T)
        integers, steps.py `step_layout` (token ids, position ids, write positions,
        the last key each query sees; each row's slot and kept position, repeated along the
        row): ONE input tensor, unpacked here, and the attention mask built here from it
        (inductor fuses it into the attention), which saves the Python and dispatch of
        building a mask and six tensors per forward outside. span: arange(S), S the key
        span. base: lo + 2 elements, lo the first row's slot (see `_layer`). keys/values:
        each layer's slot buffers (slots, kv_heads, capacity, D), written at (rows,
        positions) in place. Returns logits (B, T, V), or (B, 1, V) of each row's kept
        position with keep_last; with `head`, through that reduced head (its product and
        the scatter into the vocabulary, fused here, instead of a drafting step's separate
        ops outside). With `head_outside`, a step of several tokens a row returns the final
        norm's output (B, T, H) and leaves the output head to the caller.

        Each layer runs as `_layer`, a nested compile region: torch traces and compiles the
        first layer once and calls that code for the others (the same math, bitwise),
        instead of tracing and generating code for every layer; a cold compile takes about
        half as long. The buffers' head count and head size are pinned first: a size the
        first layer's trace specialises would break the reuse for the next ones (torch
        2.13). Then all their sizes are made constants (`mark_static` while tracing): a
        batch's buffers never change shape, and as dynamic sizes (two per buffer, 48 on the
        demo target, none of them equal to another since duck sizing is off) they would
        make tracing and fake-tensor propagation reason about every layer's indexing with
        them, roughly doubling a cold compile. Each layer runs its joined projections where
        the model's could be joined (`compile_forwards` joins them; speed/lean.py
        `Joined`): 4 products a layer instead of 7."""
        inner = lean.inner
        heads = int(lean.model.config.num_key_value_heads)
        size = lean._layers[0].self_attn.head_dim
        for buffer in (*keys, *values):
            torch._check(buffer.shape[1] == heads)
            torch._check(buffer.shape[3] == size)
            if torch.compiler.is_compiling():  # guards on the sizes; no mark on the tensor
                torch._dynamo.mark_static(buffer)
        ids, position_ids, seen, keep = inputs[0], inputs[1], inputs[3], inputs[5, :, 0]
        # What the layers take, as tensors of their own: a nested region refuses inputs that
        # alias each other (views of `inputs`).
        positions, rows = inputs[2].clone(), inputs[4, :, 0].clone()  # (B, T), (B,)
        mask = step_mask(seen, span, window, dtype)  # (B, 1, T, S)
        h = inner.embed_tokens.forward(ids)  # (B, T, H)
        cos, sin = inner.rotary_emb.forward(h, position_ids)
        family = _family(lean, ids.shape[1])
        # Several tokens a row: the rows' keys as a view of their slot range (`_layer`).
        # One token a row gathers them: inductor fuses that gather into the plain
        # attention's products, where the view measured no faster.
        view = base if contiguous and ids.shape[1] != 1 else None
        joined = lean.joined
        for i, layer in enumerate(lean._layers):
            j = None if joined is None else joined[i]
            h = _layer(
                layer, j, family, h, cos, sin, mask, keys[i], values[i], rows, positions, view
            )
        if keep_last:
            h = h[torch.arange(ids.shape[0], device=ids.device), keep][:, None]  # (B, 1, H)
        if head is None:  # T is 1 exactly, or not
            return lean.head(h, head_outside and ids.shape[1] != 1)
        return head.forward(lean.head(h, True))

    return step


def _family(lean: LeanDecoder, tokens: int) -> Family:
    """The rotary and attention functions a compiled step of `tokens` tokens a row calls.
    One token a row on a CPU: the family's plain attention (matrix product, softmax, matrix
    product, which inductor fuses around two small products) instead of the model's
    (SDPA), whose CPU kernel costs tens of microseconds a call at decode sizes, most of it
    fixed, once a layer; the one-token compiled step measured faster with the plain form,
    one row and several alike. Several tokens a row keep SDPA: there the plain form
    measured no faster, and it gives a cold compile one more C++ kernel per kind.
    Elsewhere (CUDA, not measured), the model's own. (`tokens` is 1 exactly in the
    one-token kinds: torch specialises sizes of 1, so the choice is made at trace time.)"""
    cpu = next(lean.model.parameters()).device.type == "cpu"
    return lean.plain if cpu and tokens == 1 else lean.family


@torch.compiler.nested_compile_region
def _layer(  # noqa: PLR0913 (a nested region's inputs are leaves: see below)
    layer: Any, joined: Joined | None, family: Family, h: torch.Tensor, cos: torch.Tensor,
    sin: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
    rows: torch.Tensor, positions: torch.Tensor, base: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """One layer of the step (speed/lean.py `block`): its new keys and values written into
    its slot buffers at (rows, positions), the step attending to each row's keys up to the
    span. `joined`: the layer's joined projections (speed/lean.py `Joined`), or None.

    The keys attended: with `base` (lo + 2 elements), the rows are slots lo, lo + 1, ...
    in order, and attention reads the buffers' view [lo : lo + B, :, :S], where gathering
    the rows copies every row's keys and values a layer (a sizeable share of a
    several-token step's time). Without, each row's slot is gathered. The values read are
    the same; the view measured faster in the several-token kinds and no faster in the
    one-token ones, which gather (see `_step_of`).

    Its inputs are each a tensor, a module or None, not grouped in one object: torch
    flattens a container input of a nested region as a pytree, and the guards that puts
    on the pytree registry cannot be saved with an ahead-of-time compiled step (`Precompiled`
    would compile every kind just in time)."""
    span = mask.shape[-1]
    heads = torch.arange(keys.shape[1], device=h.device)
    where = (rows[:, None, None], heads[None, :, None], positions[:, None, :])  # (B, kvH, T)

    def kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys.index_put_(where, k)
        values.index_put_(where, v)
        if base is not None:
            if keys.shape[0] == 1:  # one slot: lo is 0
                return keys[:, :, :span], values[:, :, :span]
            lo, b = base.shape[0] - 2, rows.shape[0]
            torch._check(lo >= 0)
            torch._check(lo + b <= keys.shape[0])
            return keys[lo : lo + b, :, :span], values[lo : lo + b, :, :span]
        return keys[rows, :, :span], values[rows, :, :span]  # (B, kvH, S, D)

    attend = Attend(cos, sin, mask)
    return block(layer, family, h, attend, kv, attention_extra(layer.self_attn), joined)


def _jit(step: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`step` compiled just in time, with dynamic shapes, under `_tracing`'s settings
    (inductor cannot compile `_layer`, a nested region, with a float input it reads as a
    scalar; torch 2.13). Kept config patches: a small cost every call each. `step` runs as a
    copy with a code object of its own: torch keeps compiled entries per code object and,
    past 8 of them (`recompile_limit`), runs the function eager with a warning; every
    model's step shares one code object otherwise, so a third model's kinds would run eager
    in a process that compiled two."""
    own = types.FunctionType(
        step.__code__.replace(), step.__globals__, step.__name__, step.__defaults__,
        step.__closure__,
    )  # fmt: skip
    compiled = torch.compile(own, dynamic=True, options=dict(INDUCTOR))
    floats, sizes = tracing()

    def call(*args: Any) -> torch.Tensor:
        static_layout(args[0])
        with floats, sizes:
            return compiled(*args)  # type: ignore[no-any-return]

    return call


def compile_forwards(
    lean: LeanDecoder, keep_last: bool, head: DraftHead | None = None, inductor: bool = True,
    graph_rows: int = 0, store: Path | None = None,
) -> CompiledForwards:  # fmt: skip
    """The step, compiled by inductor (lazily: nothing is traced until the first call,
    `warm_up` makes it) unless `inductor` is False; with a `store`, compiled ahead of time
    per kind and kept there (`Precompiled`: a restart loads it without tracing); with
    graph_rows > 0, padded to buckets of up to that many rows and, on CUDA, replayed as
    captured graphs (graphs.py)."""
    from gateway.speed.graphs import GraphedSteps

    lean.join_projections()
    window, dtype = model_facts(lean.model)

    # Captured graphs pad a bucket with filler rows of the first row's slot: they gather.
    # So does a draft's step: its several-token steps (a first feed after a verify) run
    # for the rows still drafting, whose slots leave gaps that filler rows would compute.
    contiguous = graph_rows <= 0 and not keep_last
    prefill_all = not keep_last and cheap_head(lean.model)
    head_outside = graph_rows <= 0 and not keep_last and head is None
    outer = lean.model.get_output_embeddings().forward if head_outside else None

    step = _step_of(StepForm(lean, keep_last, head, window, dtype, contiguous, head_outside))
    fn: Callable[..., torch.Tensor] = step
    if inductor:
        fn = _jit(step)
        if store is not None:
            fn = Precompiled(step, fn, lean, head, store, fingerprint_of(lean, keep_last, head))
    if graph_rows <= 0:
        return CompiledForwards(
            fn, keep_last, head, contiguous=contiguous, prefill_all=prefill_all, outer_head=outer
        )
    device = next(lean.model.parameters()).device
    graphs = GraphedSteps(fn, graph_rows, MAX_TOKENS, device)
    return CompiledForwards(fn, keep_last, head, KINDS, graphs, prefill_all=prefill_all)


def model_facts(model: Any) -> tuple[int | None, torch.dtype]:
    """A model whose layers all attend alike: its sliding window (None: full attention)
    and float dtype. Raises ValueError for a model whose layers differ, or attend in
    chunks (one mask cannot serve it)."""
    facts = model_layout(model)
    layout, dtype = facts.layout, facts.dtype
    if layout.uniform not in ("full_attention", "sliding_attention"):
        raise ValueError("the layers attend in several ways: no one mask serves them")
    return layout.uniform_window, dtype


def cheap_head(model: Any) -> bool:
    """Whether `model`'s output head has at most HEAD_SHARE of its layers' weights."""
    head = model.get_output_embeddings().weight.numel()
    layers = sum(p.numel() for p in model.base_model.layers.parameters())
    return head <= HEAD_SHARE * layers
