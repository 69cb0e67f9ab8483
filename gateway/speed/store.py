"""Compiled steps kept on disk between starts: each kind of step compiled ahead of time
(`Precompiled`), its file named by a fingerprint of everything it was traced from."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gateway.engine.batch.slots import PREFILL_CHUNK, slot_pad
from gateway.speed.cpu_linear import machine_identity
from gateway.speed.fast import lean_of
from gateway.speed.kinds import INDUCTOR, kind, warm_kinds

if TYPE_CHECKING:
    from gateway.engine.draft_head import DraftHead
    from gateway.engine.models import LoadedModel
    from gateway.speed.lean import LeanDecoder

log = logging.getLogger("gateway.speed.store")


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
            floats, sizes = tracing()
            with floats, sizes:
                compiler = torch.compile(
                    self.step, dynamic=True, fullgraph=True, options=dict(INDUCTOR)
                )
                static_layout(args[0])
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


def static_layout(inputs: torch.Tensor) -> None:
    """The step input's first size (its six parts) is a constant, not one of the dynamic
    sizes: as one, duck sizing would equate it with a key span or row count that happened
    to be 6 when a kind was traced (a guard every other span fails: a second graph). The
    just-in-time step marks every call (a cheap call): any call may be the one that traces. Not
    a call to a loaded ahead-of-time step: its guards refuse a marked tensor (torch 2.13)."""
    torch._dynamo.mark_static(inputs, 0)


def tracing() -> tuple[Any, Any]:
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
    fn = head.linear
    product = "torch" if fn is None else f"{fn.__module__}.{fn.__name__}"
    return f"head {tuple(head.weight.shape)} of {head.vocab}, linear {product}"


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
    `compiled_model(lm, max_rows, draft, CompileOptions(store=store,
    prefill_chunk=prefill_chunk))` compiles (so it would only load them); True for a model
    that is not compiled."""
    paths = step_paths(lm, max_rows, draft, store, prefill_chunk)
    return all(path.exists() for name, path in paths.items() if kinds is None or name in kinds)


def step_paths(
    lm: LoadedModel, max_rows: int, draft: bool, store: Path,
    prefill_chunk: int = PREFILL_CHUNK,
) -> dict[str, Path]:  # fmt: skip
    """Each kind's stored step, in `warm_up`'s order, that `compiled_model(lm, max_rows,
    draft, CompileOptions(store=store, prefill_chunk=prefill_chunk))` saves or loads; none
    for a model that is not compiled."""
    lean = lean_of(lm)
    if lean is None:
        return {}
    fingerprint = fingerprint_of(lean, draft, lm.draft_head if draft else None)
    buffers = batch_buffers(lm, max_rows, prefill_chunk)
    return {
        kind(b, t): _artifact(store, fingerprint, kind(b, t), buffers)
        for b, t in warm_kinds(max_rows)
    }


def fingerprint_of(lean: LeanDecoder, keep_last: bool, head: DraftHead | None) -> str:
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
            "gateway.speed.compiled",
            "gateway.speed.steps",
            "gateway.speed.lean",
            "gateway.engine.batch.forward",
            "gateway.speed.cpu_linear",
            "gateway.speed.packed_linear",
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
