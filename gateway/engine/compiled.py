"""A compiled decode step for the batch path: torch.compile (inductor) over the lean decoder
(batch/decoder.py), writing into and reading from the slot cache of batch/slots.py.

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
several x several. The slot buffers' sizes are constants (`_step`): a step is built for
one batch shape (`batch_buffers`). Whether the one-row one-token kind pays depends on the
CPU (eager reads the row's cache as a view with no mask, the compiled step gathers and
masks; `python -m benchmarks engine_compiled` compares them), so GATEWAY_COMPILE=auto
measures each kind and keeps the faster. `warm_up`
compiles them at start, before the gateway says it is ready; with a store (`Precompiled`)
a restart loads them instead of tracing them again.

Exactness: fused kernels compute the same math in another order, so logits may differ from
eager in the last bits and a greedy choice may part at a near tie;
tests/unit/engine/test_compiled.py compares greedy outputs with eager ones, and
`python -m benchmarks engine_compiled` counts partings on the held-out prompts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gateway.engine.batch.decoder import Family, Joined, attention_extra, block
from gateway.engine.batch.forward import model_facts, step_mask
from gateway.engine.batch.slots import PREFILL_CHUNK, SlotCache, slot_pad
from gateway.engine.cpu_linear import machine_identity

if TYPE_CHECKING:
    from gateway.engine.batch.decoder import LeanDecoder
    from gateway.engine.draft_head import DraftHead
    from gateway.engine.graphs import GraphedSteps
    from gateway.engine.models import LoadedModel

log = logging.getLogger("gateway.engine.compiled")

MAX_TOKENS = 16  # tokens a row feeds in a compiled decode, verify or drafting step
MAX_PREFILL = 2 * PREFILL_CHUNK
"""Prompt tokens a row feeds in a prefill chunk the compiled step serves (`serves`); longer
chunks (from a GATEWAY_PREFILL_CHUNK of about 205, whose lone rows take a quarter chunk
more: batch/scheduler.py `TAIL`) run eager. The step's shapes are dynamic in the tokens,
so a chunk is the same graph as a verify step (no new trace,
`tests/unit/engine/test_compiled.py`)."""
HEAD_SHARE = 0.25
"""A target step serves prefill chunks (`CompiledForwards.prefill_all`) when its output
head has at most this share of its layers' weights: the demo target's is 0.2 (a 8192 x 256
head against 12 layers of 0.85M), and its chunks measured faster compiled with the head
at every position; a model with a large vocabulary for its width (0.38 for a 152k x
896 head over 24 layers of 15M) would spend that on the head."""
KINDS = frozenset({"1x1", "1xN", "Bx1", "BxN"})
Later = tuple[frozenset[str], Callable[[], object]]  # (kinds, wait): warm_up's `then`
Claim = Callable[[str], bool]  # may this process compile a kind's stored step (its file
# name)? warm_up's `claim` (engine/precompile.py `claimer`)
FASTER = 0.97  # auto keeps a kind whose compiled step takes at most this share of eager's
INDUCTOR: dict[str, Any] = {
    "size_asserts": False,
    "post_grad_fusion_options": {"decompose_mm_pass": {}},
}
"""inductor options of the step's compile.

No size asserts: inductor's Python wrapper checks each input's sizes and strides on every
call (about 100 checks a step of the demo target), which the step's guards have checked
already, so they are pure per-call overhead; without them every kind measured faster.

Matrix products of one row as generated reductions (inductor's decompose_mm_pass; on a
CPU it takes products of exactly one row with weights up to 2048 x 2048, so on the demo
target the one-row one-token kind's projections, not its output head and no other kind):
torch's mm copies each such input first (inductor hands it a row of stride 0, which BLAS
refuses), 3 copies a layer, and calls the library for a few microseconds of work; the
reduction avoids both, and the one-row one-token step measured faster with it. With two to
eight rows the reductions measured slower than the library, which is why only one row is
taken. The sums run in another order than
BLAS's, so a greedy choice may part from eager at a near tie (`python -m benchmarks
engine_compiled` counts partings). A model given the weight-major linear (cpu_linear.py)
writes its one-row products as that reduction itself, output head included."""


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
    (batch/forward.py `contiguous_rows` arranges them, with filler rows in the gaps)."""
    prefill_all: bool = False
    """Whether this target step (every position) serves prefill chunks too (`serves`):
    set where its output head is small against its layers (`cheap_head`)."""
    outer_head: Callable[[torch.Tensor], torch.Tensor] | None = None
    """A target's output head (its forward), where the step's several-token kinds leave it
    to the caller (batch/forward.py): they return the final norm's output, and the caller
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
        """inputs: (6, B, T), batch/forward.py `step_layout`; span: arange(S), S the key
        span (batch/forward.py `span_keys`); base: a tensor of lo + 2 elements, lo the first
        row's slot (batch/forward.py `slot_base`; read by a `contiguous` step only)."""
        keys, values = cache.buffers()
        return self.step(inputs, span, base, keys, values)


def kind(rows: int, tokens: int) -> str:
    """A step's kind: one row x one token, one row x several tokens, several rows x one,
    several x several (torch specialises sizes of 1, so each kind is a graph of its own)."""
    if rows == 1:
        return "1x1" if tokens == 1 else "1xN"
    return "Bx1" if tokens == 1 else "BxN"


def _step(
    lean: LeanDecoder, keep_last: bool, head: DraftHead | None, window: int | None,
    dtype: torch.dtype, contiguous: bool, head_outside: bool, inputs: torch.Tensor,
    span: torch.Tensor, base: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
) -> torch.Tensor:  # fmt: skip
    """The lean decoder's layers as one function of tensors. inputs: (6, B, T) integers,
    batch/forward.py `step_layout` (token ids, position ids, write positions, the last key
    each query sees; each row's slot and kept position, repeated along the row): ONE input
    tensor, unpacked here, and the attention mask built here from it (inductor fuses it
    into the attention), which saves the Python and dispatch of building a mask and six
    tensors per forward outside. span: arange(S), S the key span. window, dtype: the
    model's sliding window and dtype (batch/forward.py `model_facts`). contiguous, base:
    see `_layer` (base: lo + 2 elements, lo the first row's slot). keys/values: each
    layer's slot buffers (slots, kv_heads, capacity, D), written at (rows, positions) in
    place. Returns logits (B, T, V), or (B, 1, V) of each row's kept position with
    keep_last; with `head`, through that reduced head (its product and the scatter into
    the vocabulary, fused here, instead of a drafting step's separate ops outside). With
    `head_outside`, a step of several tokens a row returns the final norm's output (B, T, H)
    and leaves the output head to the caller (`CompiledForwards.outer_head`).

    Each layer runs as `_layer`, a nested compile region: torch traces and compiles the
    first layer once and calls that code for the others (the same math, bitwise), instead
    of tracing and generating code for every layer; a cold compile takes about half as
    long. The buffers' head count and head size are pinned first: a size the first layer's
    trace specialises would break the reuse for the next ones (torch 2.13). Then all their
    sizes are made constants (`mark_static` while tracing): a batch's buffers never change
    shape, and as dynamic sizes (two per buffer, 48 on the demo target, none of them equal
    to another since duck sizing is off) they would make tracing and fake-tensor
    propagation reason about every layer's indexing with them, roughly doubling a cold
    compile. Each layer runs
    its joined projections where the model's could be joined (`compile_forwards` joins
    them; batch/decoder.py `Joined`): 4 products a layer instead of 7."""
    inner = lean.inner
    heads, size = int(lean.model.config.num_key_value_heads), lean._layers[0].self_attn.head_dim
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
    # Several tokens a row: the rows' keys as a view of their slot range (`_layer`). One
    # token a row gathers them: inductor fuses that gather into the plain attention's
    # products, where the view measured no faster.
    view = base if contiguous and ids.shape[1] != 1 else None
    joined = lean.joined
    for i, layer in enumerate(lean._layers):
        j = None if joined is None else joined[i]
        h = _layer(
            layer, j, family, h, cos, sin, mask, keys[i], values[i], rows, positions, view
        )  # fmt: skip
    if keep_last:
        h = h[torch.arange(ids.shape[0], device=ids.device), keep][:, None]  # (B, 1, H)
    if head is None:
        return lean.head(h, head_outside and ids.shape[1] != 1)  # T is 1 exactly, or not
    return head.forward(lean.head(h, True))


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
def _layer(
    layer: Any, joined: Joined | None, family: Family, h: torch.Tensor, cos: torch.Tensor,
    sin: torch.Tensor, mask: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
    rows: torch.Tensor, positions: torch.Tensor, base: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """One layer of `_step` (batch/decoder.py `block`): its new keys and values written into
    its slot buffers at (rows, positions), the step attending to each row's keys up to the
    span. `joined`: the layer's joined projections (batch/decoder.py `Joined`), or None.

    The keys attended: with `base` (lo + 2 elements), the rows are slots lo, lo + 1, ...
    in order, and attention reads the buffers' view [lo : lo + B, :, :S], where gathering
    the rows copies every row's keys and values a layer (a sizeable share of a
    several-token step's time). Without, each row's slot is gathered. The values read are
    the same; the view measured faster in the several-token kinds and no faster in the
    one-token ones, which gather (see `_step`)."""
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

    return block(layer, family, h, cos, sin, mask, kv, attention_extra(layer.self_attn), joined)


class Precompiled:
    """The step compiled ahead of time, one artifact per kind of step
    (`torch.compile(...).aot_compile`), saved in `store` and loaded from there by the next
    start: a restart then skips dynamo's tracing, which is most of a cached warm-up.

    A kind's artifact is built, or loaded, on the kind's first call (the warm-up's), traced
    on that call's tensors with dynamic sizes; its file name holds a fingerprint of what it
    was traced from (model config, dtype, device, linear forward, torch and transformers
    versions, the traced source files), so a changed model or code compiles anew. A call
    the artifact's guards refuse (a shape outside what it was traced for), a kind whose
    ahead-of-time compile failed, or an artifact that fails to load: the jit-compiled step
    serves it, as without a store (logged)."""

    def __init__(
        self, step: Callable[..., torch.Tensor], jit: Callable[..., torch.Tensor],
        lean: LeanDecoder, head: DraftHead | None, store: Path, fingerprint: str,
    ) -> None:  # fmt: skip
        self.step, self.jit, self.lean, self.head = step, jit, lean, head
        self.store, self.fingerprint = store, fingerprint
        self.fns: dict[str, Any] = {}  # kind -> its AOTCompiledFunction (None: jit serves)
        self.loaded: list[str] = []  # kinds loaded from the store (the others compiled)
        self.refused: set[str] = set()  # kinds whose artifact's guards refused a call
        self.passed: set[tuple[Any, ...]] = set()  # `_call_key`s whose guards passed

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        name = kind(args[0].shape[1], args[0].shape[2])
        key = _call_key(args)
        if key in self.passed:
            return self.fns[name](*args)  # type: ignore[no-any-return]
        first = name not in self.fns
        if first:
            self.fns[name] = self._build(name, args)
        fn = self.fns[name]
        if fn is not None and fn.guard_check(*args):
            try:  # a first call: kernels an artifact brings may fail on this host
                out: torch.Tensor = fn(*args)
            except Exception as exc:
                if not first:
                    raise
                log.warning("step kind %s compiled just in time (its first call failed: "
                            "%s: %s)", name, type(exc).__name__, exc)  # fmt: skip
                self.fns[name] = None
                if name in self.loaded:
                    self.loaded.remove(name)
            else:
                if key is not None:
                    if len(self.passed) >= 4096:  # caches come and go (tests, benchmarks)
                        self.passed.clear()
                    self.passed.add(key)
                return out
        elif fn is not None and name not in self.refused:  # said once a kind: not per step
            self.refused.add(name)
            log.warning(
                "step kind %s: a call its precompiled step's guards refuse (inputs %s): "
                "compiled just in time, which stalls serving while it compiles",
                name, ", ".join(str(tuple(a.shape)) for a in args if isinstance(a, torch.Tensor)),
            )  # fmt: skip
        return self.jit(*args)

    def _external(self) -> dict[str, Any]:
        """The objects the step reaches that are not saved with it: the model's modules."""
        lean = self.lean
        out: dict[str, Any] = {
            "lean": lean, "layers": lean._layers, "family": lean.family, "plain": lean.plain,
        }  # fmt: skip
        out.update({f"module:{n}": m for n, m in lean.model.named_modules()})
        if lean.joined is not None:
            out.update({f"joined:{n}": m for n, m in lean.joined.named_modules()})
        if self.head is not None:
            out["draft_head"] = self.head
        return out

    def _build(self, name: str, args: tuple[torch.Tensor, ...]) -> Any:
        shape = args[3][0].shape  # (slots, kv_heads, positions, D)
        path = _artifact(self.store, self.fingerprint, name, (shape[0], shape[2]))
        if path.exists():
            try:
                with path.open("rb") as f:
                    fn: Any = torch.compiler.load_compiled_function(
                        f, external_data=self._external()
                    )
                fn.disable_guard_check()  # __call__ checks them, falling back to jit
                self.loaded.append(name)
                return fn
            except Exception as exc:  # another torch, a damaged file: compile anew
                log.warning("precompiled step %s not loaded (%s): compiling it", path, exc)
        try:
            floats, sizes = _tracing()
            with floats, sizes:
                compiler = torch.compile(
                    self.step, dynamic=True, fullgraph=True, options=dict(INDUCTOR)
                )
                _static_layout(args[0])
                fn = compiler.aot_compile((args, {}))  # type: ignore[attr-defined]
        except Exception as exc:  # the API is experimental: the jit compile serves the kind
            log.warning("step kind %s compiled just in time (ahead of time failed: %s: %s)",
                        name, type(exc).__name__, exc)  # fmt: skip
            return None
        try:
            self.store.mkdir(parents=True, exist_ok=True)
            fn.save_compiled_function(str(path), external_data=self._external())
        except Exception as exc:  # serves this start all the same; the next compiles again
            log.warning("precompiled step kind %s not saved to %s (%s: %s)",
                        name, self.store, type(exc).__name__, exc)  # fmt: skip
        fn.disable_guard_check()
        return fn


def _call_key(args: tuple[torch.Tensor, ...]) -> tuple[Any, ...] | None:
    """What a call shows an artifact's guards that can differ between calls, or None for
    a call whose key would not settle them (`Precompiled` checks the guards once per key).

    Why: checking them costs tens of microseconds a call, and the step after a check runs
    slower too; a one-row one-token step of the demo target measured faster keyed than
    checked.

    The guards (torch 2.13, `guard_manager.code_parts`) check the global state (grad and
    inference mode among it); every input's dtype, device, sizes and strides, the slot
    buffers' and the weights' too; and that no two alias. What varies between calls: the
    rows and tokens (held exactly: at most slots x MAX_PREFILL shapes); the slot base's
    size, lo + 2 (held exactly: a contiguous step checks lo + rows <= slots); the key span
    S, which grows a token a step and passes for 2 <= S < the buffers' positions (held as
    S > 1; batched_forward keeps S within a slot's capacity); and the slot buffers, one
    list of tensors of one shape for a cache's life (batch/slots.py `buffers`; held by id
    and shape, not kept: a freed cache's id may come back, with buffers of that shape and
    the model's dtype and device, which the guards accept alike). The input,
    span and slot base are always fresh contiguous int64 / int8 tensors on the model's
    device, and the weights never change shape."""
    span, keys = args[1].shape[0], args[3]
    if span >= keys[0].shape[2]:
        return None
    return (
        args[0].shape, span > 1, args[2].shape[0], id(keys), id(args[4]), keys[0].shape,
        torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
    )  # fmt: skip


def _static_layout(inputs: torch.Tensor) -> None:
    """The step input's first size (its six parts) is a constant, not one of the dynamic
    sizes: as one, duck sizing would equate it with a key span or row count that happened
    to be 6 when a kind was traced (a guard every other span fails: a second graph). The
    just-in-time step marks every call (a cheap call): any call may be the one that traces. Not
    a call to a loaded ahead-of-time step: its guards refuse a marked tensor (torch 2.13)."""
    torch._dynamo.mark_static(inputs, 0)


def _tracing() -> tuple[Any, Any]:
    """The config patches both compiles trace under: float attributes (a norm's epsilon) as
    constants, which inductor needs for `_layer`, a nested region, and which aot_compile's
    restart analysis needs too; and no size equalities guessed from equal example sizes
    (duck sizing: a warm-up's slot base of 2, `slot_base`, would be tied to its 2 rows)."""
    import torch.fx.experimental._config as fx_config

    return (
        torch._dynamo.config.patch(specialize_float=True),
        fx_config.patch(use_duck_shape=False),  # type: ignore[attr-defined]
    )


def _head_facts(head: DraftHead | None) -> str:
    """What a step's graph takes from a reduced head (its tensors are the live module's)."""
    if head is None:
        return "no head"
    return f"head {tuple(head.weight.shape)} of {head.vocab}, weight-major {head.weight_major}"


def _artifact(store: Path, fingerprint: str, name: str, buffers: tuple[int, int]) -> Path:
    """A kind's stored step; `buffers`: (slots, positions) of the slot buffers it was
    compiled for, whose sizes it takes as constants (a batch of another shape compiles its
    own rather than being refused by this one's guards)."""
    slots, positions = buffers
    return store / f"step-{fingerprint}-{name}-{slots}x{positions}.pt"


def batch_buffers(
    lm: LoadedModel, max_rows: int, prefill_chunk: int = PREFILL_CHUNK
) -> tuple[int, int]:
    """(slots, positions) of the slot buffers of a batch of `max_rows` rows on this model
    prefilling `prefill_chunk` tokens a row: its context plus the pad the batch derives
    from its chunk (batch/slots.py `slot_pad`), what batch/scheduler.py and
    batch/drafting.py allocate."""
    return max_rows, lm.context_length + slot_pad(prefill_chunk)


def stored(
    lm: LoadedModel, max_rows: int, draft: bool, store: Path,
    kinds: frozenset[str] | None = None, prefill_chunk: int = PREFILL_CHUNK,
) -> bool:  # fmt: skip
    """Whether `store` holds every kind of step (of `kinds`, default all) that
    `compiled_model(lm, max_rows, draft, store=store, prefill_chunk=prefill_chunk)`
    compiles (so it would only load them); True for a model that is not compiled."""
    paths = step_paths(lm, max_rows, draft, store, prefill_chunk)
    return all(path.exists() for name, path in paths.items() if kinds is None or name in kinds)


def step_paths(
    lm: LoadedModel, max_rows: int, draft: bool, store: Path,
    prefill_chunk: int = PREFILL_CHUNK,
) -> dict[str, Path]:  # fmt: skip
    """Each kind's stored step, in `warm_up`'s order, that `compiled_model(lm, max_rows,
    draft, store=store, prefill_chunk=prefill_chunk)` saves or loads; none for a model that
    is not compiled."""
    if lm.decoder is None:
        return {}
    fingerprint = _fingerprint(lm.decoder, draft, lm.draft_head if draft else None)
    buffers = batch_buffers(lm, max_rows, prefill_chunk)
    return {
        kind(b, t): _artifact(store, fingerprint, kind(b, t), buffers)
        for b, t in _warm_kinds(max_rows)
    }


def _fingerprint(lean: LeanDecoder, keep_last: bool, head: DraftHead | None) -> str:
    """What a precompiled step was traced and generated from: a change in any of it compiles
    anew. An artifact keeps no guard on functions or modules, and inductor's generated code
    fixes the thread count and vector width, so all of these are in: the model's config
    and attention implementation, dtype, device, the linear, attention and rotary
    functions, torch and transformers versions, the traced source files, the machine
    (cpu_linear.machine_identity: CPU model, capability, cores, threads), the default
    dtype, inductor's config and TORCHINDUCTOR_*."""
    import transformers

    model = lean.model
    weight = next(model.parameters())

    def named(fn: Any) -> str:
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', type(fn).__name__)}"

    sources = [
        Path(sys.modules[m].__file__ or "").read_bytes()
        for m in (
            __name__,
            "gateway.engine.batch.decoder",
            "gateway.engine.batch.forward",
            "gateway.engine.cpu_linear",
            "gateway.engine.packed_linear",
            "gateway.engine.draft_head",
        )
    ]
    inductor = torch._inductor.config.save_config_portable()  # type: ignore[attr-defined]
    parts = [
        torch.__version__, transformers.__version__, model.config.to_json_string(),
        str(getattr(model.config, "_attn_implementation", None)), str(weight.dtype),
        str(weight.device), named(lean._layers[0].self_attn.q_proj.forward),
        named(lean.family.attention), named(lean.plain.attention), named(lean.family.rotary),
        str(keep_last), _head_facts(head),
        *machine_identity(), str(torch.get_default_dtype()),
        repr(sorted(inductor.items(), key=lambda kv: kv[0])),
        repr(sorted((k, v) for k, v in os.environ.items() if k.startswith("TORCHINDUCTOR_"))),
    ]  # fmt: skip
    digest = hashlib.sha256("\n".join(parts).encode())
    for src in sources:
        digest.update(src)
    return digest.hexdigest()[:20]


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
    floats, sizes = _tracing()

    def call(*args: Any) -> torch.Tensor:
        _static_layout(args[0])
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
    from gateway.engine.graphs import GraphedSteps

    lean.join_projections()
    window, dtype = model_facts(lean.model)

    # Captured graphs pad a bucket with filler rows of the first row's slot: they gather.
    # So does a draft's step: its several-token steps (a first feed after a verify) run
    # for the rows still drafting, whose slots leave gaps that filler rows would compute.
    contiguous = graph_rows <= 0 and not keep_last
    prefill_all = not keep_last and cheap_head(lean.model)
    head_outside = graph_rows <= 0 and not keep_last and head is None
    outer = lean.model.get_output_embeddings().forward if head_outside else None

    def step(*args: Any) -> torch.Tensor:
        return _step(lean, keep_last, head, window, dtype, contiguous, head_outside, *args)

    fn: Callable[..., torch.Tensor] = step
    if inductor:
        fn = _jit(step)
        if store is not None:
            fn = Precompiled(step, fn, lean, head, store, _fingerprint(lean, keep_last, head))
    if graph_rows <= 0:
        return CompiledForwards(
            fn, keep_last, head, contiguous=contiguous, prefill_all=prefill_all, outer_head=outer
        )
    device = next(lean.model.parameters()).device
    graphs = GraphedSteps(fn, graph_rows, MAX_TOKENS, device)
    return CompiledForwards(fn, keep_last, head, KINDS, graphs, prefill_all=prefill_all)


def cheap_head(model: Any) -> bool:
    """Whether `model`'s output head has at most HEAD_SHARE of its layers' weights."""
    head = model.get_output_embeddings().weight.numel()
    layers = sum(p.numel() for p in model.base_model.layers.parameters())
    return head <= HEAD_SHARE * layers


def compiled_model(
    lm: LoadedModel, max_rows: int, draft: bool = False,
    progress: Callable[[str], None] = log.info, measure: bool = False,
    inductor: bool = True, graphs: bool = False, store: Path | None = None,
    kinds: frozenset[str] | None = None, then: Later | None = None,
    prefill_chunk: int = PREFILL_CHUNK, claim: Claim | None = None,
) -> tuple[LoadedModel, float]:  # fmt: skip
    """``lm`` with its compiled step (a draft's: drafting, through its reduced head if it
    has one; a target's: verify), every kind of step already compiled on a slot cache
    of the batch's own shapes (so serving compiles nothing more); and the seconds the
    warm-up took. `graphs`: the step is padded to buckets and, on CUDA, replayed as
    captured graphs (graphs.py; recorded per cache on first use of a bucket); `inductor`
    False keeps the eager lean step inside them (nothing to compile). With a `store` (a
    folder), each kind is compiled ahead of time and saved there, or loaded from there when
    an earlier start saved it (`Precompiled`). With `measure`
    (GATEWAY_COMPILE=auto), each kind is then timed compiled and eager and only the kinds
    where compiling measured faster are served compiled; where none is, ``lm`` comes back
    eager. Raises ValueError for a model without a lean decoder (its family was not
    checked, batch/decoder.py): it runs eager. `kinds`, `then` and `claim`: see `warm_up`.
    `prefill_chunk`: the batch's (GATEWAY_PREFILL_CHUNK): the step is compiled for the
    slot buffers such a batch allocates (`batch_buffers`)."""
    if lm.decoder is None:
        raise ValueError("only models the lean decoder runs are compiled (Llama, Mistral, Qwen2)")
    fast = compile_forwards(
        lm.decoder, keep_last=draft, head=lm.draft_head if draft else None, inductor=inductor,
        graph_rows=max(2, max_rows) if graphs else 0, store=store,
    )  # fmt: skip
    buffers = batch_buffers(lm, max_rows, prefill_chunk)
    out = replace(lm, compiled=replace(fast, buffers=buffers))
    t0 = time.perf_counter()
    if inductor:
        warm_up(out, max_rows, progress, kinds, then, claim)
        step = fast.step if fast.graphs is None else fast.graphs.step
        if isinstance(step, Precompiled):

            def named(kinds: list[str]) -> str:
                return ", ".join(sorted(kinds)) or "none"

            built = [k for k, f in step.fns.items() if f is not None and k not in step.loaded]
            jit = [k for k, f in step.fns.items() if f is None]
            progress(
                f"{lm.path}: step kinds loaded precompiled: {named(step.loaded)}; compiled "
                f"ahead of time: {named(built)}; just in time: {named(jit)} "
                f"({step.store})"
            )
    if measure:
        ratios = measure_kinds(out, max_rows)
        kinds = faster_kinds(ratios)
        progress(
            f"{lm.path}: compiled/eager time by step kind "
            + ", ".join(f"{k} {r:.2f}" for k, r in sorted(ratios.items()))
            + f"; compiled for {', '.join(sorted(kinds)) or 'none: eager'}"
        )
        assert out.compiled is not None
        out = replace(out, compiled=replace(out.compiled, kinds=kinds) if kinds else None)
    return out, time.perf_counter() - t0


def faster_kinds(ratios: dict[str, float]) -> frozenset[str]:
    """The kinds whose compiled/eager time ratio is at most FASTER."""
    return frozenset(k for k, r in ratios.items() if r <= FASTER)


def measure_kinds(lm: LoadedModel, max_rows: int, repeats: int = 7) -> dict[str, float]:
    """Compiled/eager time (median of `repeats`) of each kind of step this model's compiled
    step serves, on a scratch cache of the batch's shapes with 128 cached tokens a row:
    one row x 1 token, one row x 3 tokens, and with two rows or more all rows x 1 and all
    rows x 3."""
    from gateway.engine.batch.costs import sync
    from gateway.engine.batch.forward import batched_forward
    from gateway.engine.models import cache_kwarg

    fast = lm.compiled
    assert fast is not None
    model, kwarg = lm.model, cache_kwarg(lm.model)
    rows = max_rows
    context = max(1, min(128, lm.context_length - 2 * MAX_TOKENS))
    fill = [[1 + (3 * r + j) % (lm.vocab_size - 1) for j in range(context)] for r in range(rows)]
    shapes = {"1x1": (1, 1), "1xN": (1, 3), "Bx1": (rows, 1), "BxN": (rows, 3)}
    shapes = {n: (b, t) for n, (b, t) in shapes.items() if n in fast.kinds and kind(b, t) == n}
    ratios: dict[str, float] = {}
    with torch.inference_mode():
        cache, slots = _scratch(lm, fill)
        for name, (b, t) in shapes.items():
            feed = [[2] * t] * b
            spent: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(repeats + 1):
                for compiled in (False, True):  # alternating, so load drifts hit both
                    for s in slots:
                        cache.length[s] = context
                    t0 = time.perf_counter()
                    batched_forward(
                        model, kwarg, cache, slots[:b], feed, lm.device,
                        keep_last=fast.keep_last, head=fast.head,
                        compiled=fast if compiled else None, decoder=lm.decoder,
                    )  # fmt: skip
                    sync(lm.device)
                    spent[compiled].append(time.perf_counter() - t0)
            eager, comp = (sorted(spent[c][1:])[repeats // 2] for c in (False, True))
            ratios[name] = comp / eager if eager > 0 else 1.0
    return ratios


def warm_up(
    lm: LoadedModel, max_rows: int, progress: Callable[[str], None] = log.info,
    kinds: frozenset[str] | None = None, then: Later | None = None,
    claim: Claim | None = None,
) -> float:  # fmt: skip
    """Trace and compile every kind of step a batch of `max_rows` rows runs (one row x one
    token, one row x several tokens, and with two rows or more several rows x one and
    several x several) on a scratch cache shaped like the batch's; returns the seconds
    spent. `kinds`: only these (a compile helper's share of a model, engine/precompile.py).
    `then` (kinds, wait): those kinds last, after calling wait() (a helper compiled them
    into the store meanwhile: they load). `claim` (with a store; engine/precompile.py
    `claimer`): asked, with the name of its stored step, before a kind not in the store is
    compiled; a kind it refuses (another process compiles it) is skipped."""
    from gateway.engine.batch.forward import batched_forward
    from gateway.engine.models import cache_kwarg

    fast = lm.compiled
    assert fast is not None
    model, kwarg = lm.model, cache_kwarg(lm.model)
    order: list[tuple[int, int] | None] = [
        k for k in _warm_kinds(max_rows) if kinds is None or kind(*k) in kinds
    ]
    if then is not None:  # None marks the wait
        order = (
            [k for k in order if k is None or kind(*k) not in then[0]]
            + [None]
            + [k for k in order if k is not None and kind(*k) in then[0]]
        )
    count = sum(k is not None for k in order)
    t0 = time.perf_counter()
    fill = [[1, 2, 3], [1, 2, 3, 4]][:max_rows]  # rows of different lengths, as in a batch
    with torch.inference_mode():
        cache, slots = _scratch(lm, fill)
        done = 0
        for step in order:
            if step is None:
                assert then is not None
                then[1]()
                continue
            rows, t = step
            if claim is not None and not _claimed(fast, kind(rows, t), claim):
                progress(left_to_other(lm.path, kind(rows, t)))
                continue
            for s, f in zip(slots, fill, strict=True):
                cache.length[s] = len(f)
            batched_forward(
                model, kwarg, cache, slots[:rows], [[1] * t] * rows, lm.device,
                keep_last=fast.keep_last, head=fast.head, compiled=fast,
                decoder=lm.decoder,
            )  # fmt: skip
            done += 1
            progress(
                f"compiling {lm.path}: step kind {done}/{count} ({rows} row(s) x {t} "
                f"token(s)), {time.perf_counter() - t0:.1f} s"
            )
    return time.perf_counter() - t0


def left_to_other(path: str, name: str) -> str:
    """The progress line of a kind another process claimed (`claim`)."""
    return f"compiling {path}: step kind {name} left to the other process compiling it"


def _claimed(fast: CompiledForwards, name: str, claim: Claim) -> bool:
    """Whether this process compiles (or loads) kind `name`: yes when it is stored or not
    precompiled at all, else as `claim` says."""
    step = fast.step if fast.graphs is None else fast.graphs.step
    if not isinstance(step, Precompiled) or fast.buffers is None:
        return True
    path = _artifact(step.store, step.fingerprint, name, fast.buffers)
    return path.exists() or claim(path.name)


def _warm_kinds(max_rows: int) -> list[tuple[int, int]]:
    """(rows, tokens) of a step of each kind `warm_up` compiles, in its order."""
    return [(b, t) for b, t in ((1, 3), (2, 1), (2, 3), (1, 1)) if b <= max_rows]


def _scratch(lm: LoadedModel, fill: list[list[int]]) -> tuple[SlotCache, list[int]]:
    """A slot cache of the buffers the compiled step was built for (`CompiledForwards.
    buffers`: a batch's, whose sizes the step takes as constants), one slot per row of
    `fill` holding that row's tokens (prefilled eager, uncommitted: callers set the
    lengths they want)."""
    from gateway.engine.batch.forward import batched_forward
    from gateway.engine.models import cache_kwarg

    assert lm.compiled is not None
    cache = lm.compiled.slot_cache(int(lm.model.config.num_hidden_layers), lm.context_length)
    slots = [cache.take() for _ in fill]
    batched_forward(lm.model, cache_kwarg(lm.model), cache, slots, fill, lm.device,
                    keep_last=True, decoder=lm.decoder)  # fmt: skip
    return cache, slots
