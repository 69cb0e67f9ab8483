"""The lean decoder (gateway/engine/batch/decoder.py) gives the transformers forward's logits
bitwise, for every family it accepts, through every kind of batch step; a broken rule is
caught by its load-time check, and an unchecked family keeps the transformers forward."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from gateway.engine.batch import decoder as decoder_module
from gateway.engine.batch.decoder import LeanDecoder, build_decoder, reference_logits
from gateway.engine.batch.forward import batched_forward
from gateway.engine.batch.slots import SlotCache
from gateway.engine.models import cache_kwarg, wrap_model

from .conftest import CONTEXT, gpt2, llama
from .test_batch import _mistral, _qwen2

BUILDERS = {
    "llama": lambda vocab, eos: llama(vocab, eos, seed=7),
    "qwen2": _qwen2,
    "mistral": _mistral,  # sliding window 16: steps below reach past it
}


@pytest.mark.parametrize("family", sorted(BUILDERS))
@pytest.mark.parametrize("cpu_linear", [False, True])
def test_lean_logits_equal_the_transformers_forward_bitwise(family, cpu_linear, tokenizer):
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    lm = wrap_model(BUILDERS[family](vocab, eos), tokenizer, cpu_linear=cpu_linear)
    assert isinstance(lm.decoder, LeanDecoder), f"{family}: the load-time check refused it"
    model, kwarg = lm.model, cache_kwarg(lm.model)
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
            ref = reference_logits(model, kwarg, caches[0], slots, feeds, lm.device, **kw)
            got = batched_forward(
                model, kwarg, caches[1], slots, feeds, lm.device, decoder=lm.decoder, **kw
            )
            for r, (a, b) in enumerate(zip(ref, got, strict=True)):
                assert a.shape == b.shape
                assert torch.equal(a, b), f"{family} step {steps} row {r} ({kind}): differ"
            if kind == "keep_last":  # the kept position is each row's last, whatever kept_rows
                # does for both sides above: the model's own head over every position agrees
                # up to the BLAS's rounding (rewriting the same keys and values is harmless)
                full = batched_forward(model, kwarg, caches[0], slots, feeds, lm.device)
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
    with caplog.at_level(logging.WARNING, logger="gateway.engine.decoder"):
        assert build_decoder(model, cache_kwarg(model)) is None
    assert "differ" in caplog.text
    monkeypatch.undo()
    assert isinstance(build_decoder(model, cache_kwarg(model)), LeanDecoder)


def test_an_unchecked_family_keeps_the_transformers_forward(tokenizer):
    lm = wrap_model(gpt2(len(tokenizer), tokenizer.eos_token_id, seed=2), tokenizer)
    assert lm.decoder is None
    lean_off = wrap_model(
        llama(len(tokenizer), tokenizer.eos_token_id, seed=7), tokenizer, lean=False
    )
    assert lean_off.decoder is None
