"""Where speed attaches to a loaded model: the one place that gives a core LoadedModel
(gateway/engine/models.py) its faster forms, the lean decoder (lean.py) and the CPU
linear form (cpu_linear.py); compiled steps are added on top by warmup.py
`compiled_model`. The core never imports this package."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from gateway.engine.models import LoadedModel, load_model, wrap_model
from gateway.speed.cpu_linear import linear, use_weight_major_linear, weight_major_pays
from gateway.speed.fast import Accelerated
from gateway.speed.kept_parity import KeptParity, parity_key
from gateway.speed.lean import LeanDecoder, unchecked_decoder


def accelerate(
    lm: LoadedModel,
    cpu_linear: bool | None = None,
    lean: bool = True,
    compiled: bool = False,
    kept: tuple[KeptParity, str] | None = None,
) -> LoadedModel:
    """`lm` with its lean decoder (when its family has one and its logits match the model's
    bitwise) and, with `cpu_linear`, its fp32 CPU linear layers (in place) and reduced head
    given the weight-major forward (cpu_linear.py). cpu_linear None measures whether that
    pays on this machine, on the products its steps will run: with `compiled` (its steps
    are to be compiled), those of the compiled step, whose projections are joined (the
    verdict can differ between the model's own products and the joined ones). `kept`: where
    the lean decoder's parity verdict is kept between starts, and the weights' checksum
    (kept_parity.py); None checks it every load."""
    model = lm.model
    decoder = unchecked_decoder(model) if lean else None
    if cpu_linear is None:
        served = decoder.compiled_linears() if compiled and decoder is not None else None
        cpu_linear = weight_major_pays(model, served)
    if cpu_linear:
        use_weight_major_linear(model)
        if decoder is not None and decoder.joined is not None:
            use_weight_major_linear(decoder.joined)
        if lm.draft_head is not None:
            lm.draft_head.linear = linear
    decoder = None if decoder is None else _checked(decoder, cpu_linear, kept)
    return replace(lm, fast=Accelerated(decoder) if decoder is not None else None)


def _checked(
    decoder: LeanDecoder, weight_major: bool, kept: tuple[KeptParity, str] | None
) -> LeanDecoder | None:
    """`decoder.checked()`, or `decoder` where a start with the same key passed it."""
    if kept is None:
        return decoder.checked()
    store, weights = kept
    key = parity_key(decoder.model, weights, weight_major, decoder.joined is not None)
    if store.passed(key):
        return decoder
    checked = decoder.checked()
    if checked is not None:
        store.keep(key)
    return checked


def load_fast(
    path: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    draft_vocab: bool = True,
    cpu_linear: bool | None = None,
    compiled: bool = False,
    kept: tuple[KeptParity, str] | None = None,
) -> LoadedModel:
    """`load_model` (engine/models.py), then `accelerate`."""
    lm = load_model(path, device, dtype, draft_vocab)
    return accelerate(lm, cpu_linear, compiled=compiled, kept=kept)


def wrap_fast(
    model: Any,
    tokenizer: Any,
    *,
    cpu_linear: bool | None = None,
    lean: bool = True,
    compiled: bool = False,
    **where: Any,
) -> LoadedModel:
    """`wrap_model` (engine/models.py; `where`: its path, device, draft_vocab), then
    `accelerate`."""
    return accelerate(wrap_model(model, tokenizer, **where), cpu_linear, lean, compiled)
