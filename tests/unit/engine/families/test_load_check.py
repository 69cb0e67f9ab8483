"""A model the engine cannot serve exactly is refused at load, with the reason; a family
outside the conformance suite is served only when its slot-cache forward matches its own
(gateway/engine/families.py)."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers

from gateway.engine import DecodeRequest, Engine, SamplingParams, UnsupportedModel
from gateway.engine.batch import masks
from gateway.engine.families import CHECKED, probe
from gateway.speed import wrap_fast
from tests.support.batch import Job, drive

from .support import CONTEXT, FAMILIES, WINDOW, tokenizer


def _tiny(config: str, model: str, layers: int = 2, **extra) -> torch.nn.Module:  # type: ignore[no-untyped-def]
    torch.manual_seed(3)
    eos = tokenizer().eos_token_id
    cfg = getattr(transformers, config)(
        vocab_size=len(tokenizer()), hidden_size=64, intermediate_size=128,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=CONTEXT, initializer_range=0.2, bos_token_id=eos,
        eos_token_id=eos, pad_token_id=eos, **extra,
    )  # fmt: skip
    return getattr(transformers, model)(cfg).eval()


def test_every_family_of_the_suite_is_one_the_engine_serves_without_a_probe() -> None:
    kinds = {f.build().config.model_type for f in FAMILIES}
    assert kinds == CHECKED


def test_a_recurrent_model_is_refused_naming_its_layer_type() -> None:
    mamba = _tiny("MambaConfig", "MambaForCausalLM")
    with pytest.raises(UnsupportedModel, match="linear_attention"):
        wrap_fast(mamba, tokenizer())


def test_a_family_whose_slot_cache_forward_fails_is_refused_with_the_reason() -> None:
    """Bloom keeps its keys in a layout of its own (ALiBi, fused heads): the probe's forward
    on the slot cache fails, and the load says so instead of serving it."""
    bloom = _tiny("BloomConfig", "BloomForCausalLM", n_head=4, n_layer=2)
    with pytest.raises(UnsupportedModel, match="bloom: not a family this engine was checked"):
        wrap_fast(bloom, tokenizer())


def test_an_unchecked_family_that_passes_the_probe_is_served_exactly(caplog) -> None:
    """StarCoder 2 (every layer sliding) is not in the suite: the probe passes, a warning
    says it was probed, and a batch decodes what generate does."""
    model = _tiny("Starcoder2Config", "Starcoder2ForCausalLM", sliding_window=WINDOW)
    assert model.config.model_type not in CHECKED
    with caplog.at_level(logging.WARNING, "gateway.engine.families"):
        lm = wrap_fast(model, tokenizer())
    assert "not in the engine's family conformance suite" in caplog.text
    prompt = tuple(range(5, 5 + 3 * WINDOW))
    eos = tokenizer().eos_token_id
    with torch.inference_mode():
        ref = model.generate(
            torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=eos,
            pad_token_id=eos, attention_mask=torch.ones(1, len(prompt)),
        )[0, len(prompt) :].tolist()  # fmt: skip
    engine = Engine(lm)
    sp = SamplingParams(temperature=0.0, max_tokens=16)
    out = drive(engine.batch(2), engine, [Job(0, DecodeRequest(prompt, sp))])
    assert list(out[0].token_ids) == ref


def test_the_probe_refuses_a_forward_that_ignores_the_window(monkeypatch) -> None:
    """Negative control: with the masks' windows dropped, the same StarCoder 2 model's
    slot-cache logits part from its own forward, and the load refuses it."""
    from gateway.engine.batch import forward

    real = masks.layer_masks

    def no_window(layout, *args, **kwargs):  # type: ignore[no-untyped-def]
        return real(masks.AttentionLayout((masks.FULL,) * len(layout.kinds)), *args, **kwargs)

    model = _tiny("Starcoder2Config", "Starcoder2ForCausalLM", sliding_window=WINDOW)
    assert probe(model) < 1e-4
    monkeypatch.setattr(forward, "layer_masks", no_window)
    assert probe(model) > 1e-2
    with pytest.raises(UnsupportedModel, match="differ from its own forward"):
        wrap_fast(model, tokenizer())
