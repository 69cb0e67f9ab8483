"""The batch path's forward for Llama-style decoders, without transformers' per-call machinery.

Why: at the demo sizes a forward is mostly overhead. transformers' model forward wraps every
call in decorators (deprecated-argument checks, output capturing, mask preparation, output
dataclasses) and every layer, norm and projection in nn.Module.__call__; at 12 layers that
is about a millisecond a forward on this CPU, a quarter of a one-row decode step.

What: `LeanDecoder` runs the same modules' own `forward` methods, with the same tensor ops
in the same order (embedding, rotary tables from the model's own rotary module, per layer:
norm, q/k/v projections, the family's rotary function, the cache update, the model's
attention function with its scaling, output projection, residual, norm, MLP, residual;
final norm, output head). So its logits are bitwise equal to the model's forward, not
merely close: `build` checks that on a scratch cache before it is used, and keeps the
transformers forward (with a log line saying why) for a model where they differ.

Also: with `keep_last` the output head runs on each row's last position only (a prefill
chunk of 128 tokens no longer multiplies 127 discarded rows by the vocabulary). One row
keeps its last two positions: a BLAS product of one row rounds otherwise than the same row
inside a larger product, and the full forward multiplies the whole chunk.

Which models: the families whose decoder layers have this shape and were checked token for
token in tests/unit/speed/test_lean.py (Llama, Mistral, Qwen2), when every layer attends
alike (one mask serves them all). Any other model keeps the transformers forward.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import torch

from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.batch.masks import FULL, SLIDING, attention_layout
from gateway.engine.batch.slots import SlotCache
from gateway.speed.steps import kept_rows

log = logging.getLogger("gateway.speed.lean")

KeyValues = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

FAMILIES = ("llama", "mistral", "qwen2")  # model_type values checked in the tests


class LeanDecoder:
    """Callable like the model for the batch path: ``(input_ids, attention_mask,
    position_ids, cache, keep) -> (B, T or 1, V)`` logits, or hidden states with
    backbone."""

    def __init__(self, model: Any) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.model = model
        self.inner = model.base_model
        cfg = model.config
        first = self.inner.layers[0].self_attn
        source = sys.modules[type(first).__module__]  # the family's modeling module
        self.family = Family(
            source.apply_rotary_pos_emb,
            ALL_ATTENTION_FUNCTIONS.get_interface(
                cfg._attn_implementation, source.eager_attention_forward
            ),
        )
        # The family's plain attention (matrix product, softmax, matrix product): what a
        # compiled one-token step runs on a CPU (speed/compiled.py `_family`)
        self.plain = Family(source.apply_rotary_pos_emb, source.eager_attention_forward)
        self._layers = list(self.inner.layers[: cfg.num_hidden_layers])
        self._extra = [attention_extra(layer.self_attn) for layer in self._layers]
        self.joined: torch.nn.ModuleList | None = None  # see join_projections
        self._join_tried = False

    def join_projections(self) -> torch.nn.ModuleList | None:
        """Each layer's joined projections (`Joined`), for the compiled step, kept in
        `joined`; built on the first call (re-pointing the layers' projections at the
        joined weights). None where a layer's cannot be joined: the compiled step then runs
        the layers' own."""
        if not self._join_tried:
            self._join_tried = True
            joins = [j for j in (join(layer) for layer in self._layers) if j is not None]
            if len(joins) == len(self._layers):
                self.joined = torch.nn.ModuleList(joins)
        return self.joined

    def compiled_linears(self) -> list[torch.nn.Linear] | None:
        """The linear layers a compiled step multiplies by, in the order it reads them: per
        layer the joined q/k/v, the output projection, the joined gate/up and the down
        projection; then the output head. Joins the projections (`join_projections`); None
        where they cannot be joined."""
        joined = self.join_projections()
        if joined is None:
            return None
        out: list[torch.nn.Linear] = []
        for layer, j in zip(self._layers, joined, strict=True):
            assert isinstance(j, Joined)
            out += [j.qkv, layer.self_attn.o_proj, j.gate_up, layer.mlp.down_proj]
        return [*out, self.model.get_output_embeddings()]

    def checked(self) -> LeanDecoder | None:
        """Itself when its logits equal the model's own forward bitwise on a scratch slot
        cache (several rows of different lengths, one token and several); None otherwise,
        with the reason logged. Run once the model's linear forward is settled."""
        kind = getattr(self.model.config, "model_type", None)
        try:
            if _parity(self.model, self):
                return self
            log.warning("%s: transformers forward (lean decoder's logits differ)", kind)
        except Exception as exc:  # an unexpected layout: keep the model's own forward
            log.warning("%s: transformers forward (lean decoder failed: %s)", kind, exc)
        return None

    def hidden(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None, kv: KeyValues,
        states: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """(B, T, H) hidden states after the last layer (before the final norm). `kv(i, k,
        v)` stores layer i's new keys and values (B, kv_heads, T, D) and returns the keys and
        values the step attends to: the cache's update (here) or the compiled step's writes
        into the slot buffers (speed/compiled.py). With `states`, every layer's input is
        appended to it, then the final norm's output (as transformers' hidden_states list
        them: a step's FeatureTap reads them)."""
        inner = self.inner
        h = inner.embed_tokens.forward(input_ids)  # (B, T, H)
        cos, sin = inner.rotary_emb.forward(h, position_ids)
        attend = Attend(cos, sin, attention_mask)
        for i, layer in enumerate(self._layers):
            if states is not None:
                states.append(h)
            h = block(
                layer, self.family, h, attend,
                lambda k, v, i=i: kv(i, k, v),  # type: ignore[misc]
                self._extra[i],
            )  # fmt: skip
        if states is not None:  # the last one after the final norm, as transformers'
            states.append(inner.norm.forward(h))
        return h

    def head(self, h: torch.Tensor, backbone: bool) -> torch.Tensor:
        """The final norm, then the output head unless `backbone`."""
        h = self.inner.norm.forward(h)
        return h if backbone else self.model.lm_head.forward(h)

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        cache: Any,
        keep: list[int] | None = None,
        backbone: bool = False,
        states: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """(B, T, V) logits; with `keep` (row r's position keep[r]), (B, 1, V); with
        backbone, the final hidden states instead of logits; `states`: see `hidden`."""
        h = self.hidden(
            input_ids, position_ids, attention_mask, lambda i, k, v: cache.update(k, v, i),
            states,
        )  # fmt: skip
        if keep is not None:
            h = kept_rows(h, keep)
        out = self.head(h, backbone)
        return out[:, -1:] if keep is not None else out


class Family(torch.nn.Module):
    """The functions a layer calls besides its modules' own: the family's rotary function
    and the model's attention function. A module (holding no weights) so that the compiled
    step's per-layer region (speed/compiled.py `_layer`) can take it as an argument:
    torch.compile guards a plain object or function argument of a nested region by
    pytree's registry, a guard an ahead-of-time artifact cannot save (torch 2.13)."""

    def __init__(self, rotary: Callable[..., Any], attention: Callable[..., Any]) -> None:
        super().__init__()
        self.rotary = rotary
        self.attention = attention


class Joined(torch.nn.Module):
    """A layer's projections that read the same input, each group as one linear layer:
    q, k and v (`qkv`), the MLP's gate and up (`gate_up`). What the compiled step runs
    (speed/compiled.py): at decode sizes a product's cost is mostly its fixed per-call
    part, so 4 products a layer instead of 7 cost less (measured faster on CPU in raw
    products, and each product saved also saves inductor's per-call wrapper work). The
    joined weight owns the memory; the layer's own projections are
    re-pointed at row ranges of it (the same values, contiguous), so nothing is held
    twice and the eager decoder is unchanged. Built by `join`, which returns None for a
    layer whose projections cannot be joined (some with a bias, some without; other
    dtypes or devices)."""

    def __init__(
        self, qkv: torch.nn.Linear, q_k_v: list[int], gate_up: torch.nn.Linear, g_u: list[int]
    ) -> None:
        super().__init__()
        self.qkv, self.gate_up = qkv, gate_up
        self.q_k_v, self.g_u = q_k_v, g_u  # the parts' output sizes


def join(layer: Any) -> Joined | None:
    """`layer`'s projections joined (`Joined`), or None where they cannot be."""
    a, m = layer.self_attn, layer.mlp
    groups = ([a.q_proj, a.k_proj, a.v_proj], [m.gate_proj, m.up_proj])
    if not all(_joinable(g) for g in groups):  # checked before any weight is re-pointed
        return None
    qkv, gate_up = (_joined(g) for g in groups)
    sizes = [a.q_proj.out_features, a.k_proj.out_features, a.v_proj.out_features]
    return Joined(qkv, sizes, gate_up, [m.gate_proj.out_features, m.up_proj.out_features])


def _joinable(parts: list[Any]) -> bool:
    """Whether `parts` can be one nn.Linear: plain nn.Linear layers of one input size, dtype
    and device, all with a bias or none, with one forward (torch's or cpu_linear's)."""
    if any(type(p) is not torch.nn.Linear for p in parts):
        return False
    return (
        len({(p.weight.dtype, p.weight.device, p.weight.shape[1]) for p in parts}) == 1
        and len({p.bias is not None for p in parts}) == 1
        and len({_forward(p) for p in parts}) == 1
    )


def _forward(linear: Any) -> Any:
    """The function a patched nn.Linear's forward is bound to (cpu_linear), or None."""
    return getattr(linear.__dict__.get("forward"), "__func__", None)


def _joined(parts: list[Any]) -> torch.nn.Linear:
    """One nn.Linear computing `parts` (`_joinable`) side by side: its weight (and bias) the
    parts' concatenated, which each part's parameters become views of, and the parts'
    forward (cpu_linear's weight-major one where the model was given it)."""
    w0, biased = parts[0].weight, parts[0].bias is not None
    rows = [p.weight.shape[0] for p in parts]
    out = torch.nn.Linear(w0.shape[1], sum(rows), bias=biased, device=w0.device,
                          dtype=w0.dtype)  # fmt: skip
    out.requires_grad_(False)
    with torch.no_grad():
        out.weight.data = torch.cat([p.weight.detach() for p in parts])
        if biased:
            out.bias.data = torch.cat([p.bias.detach() for p in parts])
        start = 0
        for p, n in zip(parts, rows, strict=True):
            p.weight.data = out.weight.data[start : start + n]
            if biased:
                p.bias.data = out.bias.data[start : start + n]
            start += n
    forward = _forward(parts[0])
    if forward is not None:  # the model's patched linear forward (cpu_linear)
        out.forward = types.MethodType(forward, out)  # type: ignore[method-assign]
    return out


class Attend(NamedTuple):
    """What every layer of a step attends with: the rotary tables (cos, sin) of the step's
    positions and its attention mask (None: the model's attention needs none)."""

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None


def block(
    layer: Any, family: Family, h: torch.Tensor, attend: Attend,
    kv: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    extra: dict[str, Any], joined: Joined | None = None,
) -> torch.Tensor:  # fmt: skip
    """One decoder layer: (B, T, H) hidden states in, out, with the family's functions
    (`Family`), attending with `attend` (`Attend`). `kv(k, v)` stores the layer's new keys
    and values and returns those the step attends to; `extra`: the layer's
    `attention_extra`. With `joined` (the layer's
    `Joined`), its joined projections instead of the layer's own: the same math, another
    product shape (its rounding may differ in the last bits), so the eager decoder, which
    must equal the model's forward bitwise, passes none."""
    b, t = h.shape[0], h.shape[1]
    a = layer.self_attn
    x = layer.input_layernorm.forward(h)
    shape = (b, t, -1, a.head_dim)
    if joined is None:
        q, k, v = a.q_proj.forward(x), a.k_proj.forward(x), a.v_proj.forward(x)
    else:
        q, k, v = joined.qkv.forward(x).split(joined.q_k_v, dim=-1)
    q = q.view(shape).transpose(1, 2)  # (B, heads, T, D)
    k = k.view(shape).transpose(1, 2)
    v = v.view(shape).transpose(1, 2)
    q, k = family.rotary(q, k, attend.cos, attend.sin)
    k, v = kv(k, v)
    o, _ = family.attention(a, q, k, v, attend.mask, dropout=0.0, scaling=a.scaling, **extra)
    h = h + a.o_proj.forward(o.reshape(b, t, -1).contiguous())
    x = layer.post_attention_layernorm.forward(h)
    m = layer.mlp
    if joined is None:
        gate, up = m.gate_proj.forward(x), m.up_proj.forward(x)
    else:
        gate, up = joined.gate_up.forward(x).split(joined.g_u, dim=-1)
    return h + m.down_proj.forward(m.act_fn(gate) * up)


def attention_extra(attention: Any) -> dict[str, Any]:
    """What the family's attention call takes besides the tensors (a sliding window)."""
    if hasattr(attention, "sliding_window"):
        return {"sliding_window": attention.sliding_window}
    return {}


def reference_logits(model: Any, step: Step) -> list[torch.Tensor]:
    """What the lean decoder must give bitwise, computed by the model's own forward:
    `batched_forward` without it, except that a keep_last step's logits are the
    model's output head applied to the rows `kept_rows` picks from its final hidden states.
    A head over every position multiplies another number of rows, and a BLAS may round a
    row by how many rows share its product (MKL, for one, may round in classes of row
    counts, which depend on the CPU), so comparing with that would test the BLAS, not the
    decoder."""
    if not step.keep_last or step.backbone:
        return batched_forward(model, step)
    hidden = batched_forward(model, replace(step, keep_last=False, backbone=True))
    feeds = step.tokens
    device = hidden[0].device
    t = max(len(f) for f in feeds)
    h = torch.zeros(len(feeds), t, hidden[0].shape[-1], dtype=hidden[0].dtype, device=device)
    for r, x in enumerate(hidden):
        h[r, : x.shape[0]] = x
    out = model.get_output_embeddings()(kept_rows(h, [len(f) - 1 for f in feeds]))
    return [out[r, -1:] for r in range(len(feeds))]


def build_decoder(model: Any) -> LeanDecoder | None:
    """A LeanDecoder for `model` when its family is one of FAMILIES and its logits equal
    the model's own forward bitwise (`LeanDecoder.checked`); None otherwise, with the
    reason logged."""
    lean = unchecked_decoder(model)
    return None if lean is None else lean.checked()


def unchecked_decoder(model: Any) -> LeanDecoder | None:
    """A LeanDecoder for `model` when its family is one of FAMILIES, before the check of its
    logits (`LeanDecoder.checked`): for a loader that settles the model's linear forward on
    the decoder's joined projections first (attach.py `accelerate`). None otherwise, with
    the reason logged."""
    kind = getattr(model.config, "model_type", None)
    if kind not in FAMILIES:
        log.info("%s: transformers forward (lean decoder not checked for this family)", kind)
        return None
    if attention_layout(model.config).uniform not in (FULL, SLIDING):
        log.info("%s: transformers forward (its layers attend in several ways)", kind)
        return None
    try:
        return LeanDecoder(model)
    except Exception as exc:  # an unexpected layout: keep the model's own forward
        log.warning("%s: transformers forward (lean decoder failed: %s)", kind, exc)
    return None


def _parity(model: Any, lean: LeanDecoder) -> bool:
    from gateway.speed.fast import Accelerated

    fast = Accelerated(lean)
    layers = int(model.config.num_hidden_layers)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    caches = [SlotCache(layers, 2, 64, pad=8) for _ in range(2)]
    steps = [  # (slots, feeds, keep_last)
        ([0], [[3, 5, 7, 9]], True), ([0, 1], [[11], [4, 6]], False), ([1], [[8]], False),
        ([0, 1], [[2, 4], [5]], True), ([0, 1], [[2], [5]], False),
    ]  # fmt: skip
    with torch.inference_mode():
        for cache in caches:
            cache.take(), cache.take()
        for slots, feeds, last in steps:
            feeds = [[x % vocab for x in f] for f in feeds]
            ref = reference_logits(model, Step(caches[0], slots, feeds, keep_last=last))
            got = batched_forward(model, Step(caches[1], slots, feeds, keep_last=last), fast)
            if not all(torch.equal(a, b) for a, b in zip(ref, got, strict=True)):
                return False
            for c in caches:
                for s, f in zip(slots, feeds, strict=True):
                    c.length[s] += len(f)
    return True
