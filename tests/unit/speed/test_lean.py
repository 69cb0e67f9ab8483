"""The lean decoder (gateway/speed/lean.py) gives the transformers forward's logits
bitwise, for every family it accepts, through every kind of batch step; a broken rule is
caught by its load-time check, and an unchecked family keeps the transformers forward."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.batch.slots import SlotCache
from gateway.speed import lean as decoder_module
from gateway.speed import wrap_fast
from gateway.speed.fast import Accelerated, lean_of
from gateway.speed.lean import LeanDecoder, build_decoder, reference_logits
from tests.support.batch import mistral, qwen2
from tests.support.models import CONTEXT, gpt2, llama

BUILDERS = {
    "llama": lambda vocab, eos: llama(vocab, eos, seed=7),
    "qwen2": qwen2,
    "mistral": mistral,  # sliding window 16: steps below reach past it
}


@pytest.mark.parametrize("family", sorted(BUILDERS))
@pytest.mark.parametrize("cpu_linear", [False, True])
def test_lean_logits_equal_the_transformers_forward_bitwise(family, cpu_linear, tokenizer):
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    lm = wrap_fast(BUILDERS[family](vocab, eos), tokenizer, cpu_linear=cpu_linear)
    assert isinstance(lean_of(lm), LeanDecoder), f"{family}: the load-time check refused it"
    model = lm.model
    layers = int(model.config.num_hidden_layers)
    caches = [SlotCache(layers, 4, CONTEXT, pad=8) for _ in range(2)]
    rng = random.Random(3)
    for c in caches:
        for _ in range(4):
            c.take()
    steps = 0
    with torch.inference_mode():
        while steps < 40:
            room = [s for s in range(4) if caches[0].length[s] < CONTEXT - 9]
            if not room:
                break
            slots = sorted(rng.sample(room, rng.randint(1, len(room))))
            feeds = [
                [rng.randrange(vocab) for _ in range(rng.choice([1, 1, 3, 5, 8]))] for _ in slots
            ]
            kind = rng.choice(["logits", "keep_last", "backbone"])
            kw = {"keep_last": kind != "logits", "backbone": kind == "backbone"}
            ref = reference_logits(model, Step(caches[0], slots, feeds, **kw))
            got = batched_forward(
                model, Step(caches[1], slots, feeds, **kw), Accelerated(lean_of(lm))
            )
            for r, (a, b) in enumerate(zip(ref, got, strict=True)):
                assert a.shape == b.shape
                assert torch.equal(a, b), f"{family} step {steps} row {r} ({kind}): differ"
            if kind == "keep_last":  # the kept position is each row's last, whatever kept_rows
                # does for both sides above: the model's own head over every position agrees
                # up to the BLAS's rounding (rewriting the same keys and values is harmless)
                full = batched_forward(model, Step(caches[0], slots, feeds))
                for r, f in enumerate(feeds):
                    torch.testing.assert_close(got[r][0], full[r][len(f) - 1], rtol=1e-4, atol=1e-5)
            for c in caches:
                for s, f in zip(slots, feeds, strict=True):
                    c.length[s] += len(f)
            steps += 1
    assert steps >= 20
    assert max(caches[0].length) > 16  # past the mistral window


def test_a_broken_rule_is_caught_at_load_and_the_model_keeps_its_own_forward(
    tokenizer, monkeypatch, caplog
):
    class NoRotary(LeanDecoder):  # forgets the rotary embedding: a wrong decoder
        def __init__(self, model):
            super().__init__(model)
            self.family.rotary = lambda q, k, cos, sin: (q, k)

    monkeypatch.setattr(decoder_module, "LeanDecoder", NoRotary)
    model = llama(len(tokenizer), tokenizer.eos_token_id, seed=7).eval()
    with caplog.at_level(logging.WARNING, logger="gateway.speed.lean"):
        assert build_decoder(model) is None
    assert "differ" in caplog.text
    monkeypatch.undo()
    assert isinstance(build_decoder(model), LeanDecoder)


def test_an_unchecked_family_keeps_the_transformers_forward(tokenizer):
    lm = wrap_fast(gpt2(len(tokenizer), tokenizer.eos_token_id, seed=2), tokenizer)
    assert lean_of(lm) is None
    lean_off = wrap_fast(
        llama(len(tokenizer), tokenizer.eos_token_id, seed=7), tokenizer, lean=False
    )
    assert lean_of(lean_off) is None


@pytest.mark.parametrize("family", sorted(BUILDERS))
@pytest.mark.parametrize("cpu_linear", [False, True])
def test_joined_projections_compute_the_layers_own_and_hold_no_second_copy(
    family, cpu_linear, tokenizer
):
    """What the compiled step runs (decoder.Joined: q/k/v as one product, gate/up as one;
    Qwen2's biases, grouped key/value heads, Mistral's window) gives the lean decoder's
    logits to rounding, the layers' projections become views of the joined weights (no
    second copy), and the lean decoder still equals the transformers forward bitwise."""
    from gateway.speed.compiled import compile_forwards
    from gateway.speed.lean import _parity

    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    lm = wrap_fast(BUILDERS[family](vocab, eos), tokenizer, cpu_linear=cpu_linear)
    lean = lean_of(lm)
    assert isinstance(lean, LeanDecoder)
    weights = {n: p.detach().clone() for n, p in lm.model.named_parameters()}
    step = compile_forwards(lean, keep_last=False, inductor=False)  # joins
    assert lean.joined is not None and len(lean.joined) == lm.model.config.num_hidden_layers
    for layer, joined in zip(lean._layers, lean.joined, strict=True):
        a, m = layer.self_attn, layer.mlp
        for whole, parts in ((joined.qkv, (a.q_proj, a.k_proj, a.v_proj)),
                             (joined.gate_up, (m.gate_proj, m.up_proj))):  # fmt: skip
            assert whole.forward.__func__ is parts[0].forward.__func__  # the model's linear
            for p in parts:
                for name in ("weight", "bias"):
                    part, joint = getattr(p, name), getattr(whole, name)
                    assert (part is None) == (joint is None)
                    if part is not None:  # a view of the joined storage
                        storage = part.untyped_storage().data_ptr()
                        assert storage == joint.untyped_storage().data_ptr()
    for n, p in lm.model.named_parameters():  # the same values
        assert torch.equal(p, weights[n]), n
    layers = int(lm.model.config.num_hidden_layers)
    caches = [SlotCache(layers, 3, CONTEXT, pad=8) for _ in range(2)]
    with torch.inference_mode():
        assert _parity(lm.model, lean)
        for c in caches:
            c.take(), c.take(), c.take()
        for feeds in ([[3, 4, 5], [6, 7], [8] * 20], [[9], [10], [11]], [[12, 13], [14], [15]]):
            outs = [
                batched_forward(lm.model, Step(c, [0, 1, 2], feeds), Accelerated(lean, fast))
                for c, fast in zip(caches, (None, step), strict=True)
            ]
            for a, b in zip(*outs, strict=True):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
            for c in caches:
                for s, f in enumerate(feeds):
                    c.length[s] += len(f)


def test_projections_that_cannot_be_joined_are_left_as_they_are(tokenizer):
    from gateway.speed.lean import join

    model = llama(len(tokenizer), tokenizer.eos_token_id, seed=7).eval()
    layer = model.model.layers[0]
    before = {n: p.data_ptr() for n, p in layer.named_parameters()}
    k = layer.self_attn.k_proj
    k.bias = torch.nn.Parameter(torch.zeros(k.out_features))
    assert join(layer) is None  # one of q, k, v with a bias: nothing re-pointed
    assert {n: p.data_ptr() for n, p in layer.named_parameters() if n in before} == before
    k.bias = None
    assert join(layer) is not None
    assert layer.self_attn.q_proj.weight.data_ptr() != before["self_attn.q_proj.weight"]
