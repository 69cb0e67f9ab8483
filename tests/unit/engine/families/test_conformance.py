"""Every family users serve decodes through the engine exactly as transformers' `generate`.

For each family in support.FAMILIES (tiny random weights; windows and chunks shorter than
the prompts, so that each layer's own attention rule decides the output), greedy output
through the engine is compared token for token with `generate` on the same model:

- standard decoding alone (the one-request loop, its own DynamicCache);
- speculative decoding alone, with a draft of the same family and with prompt lookup;
- a mixed continuous batch on a slot cache (rows of several lengths joining at different
  steps; standard, draft-model and prompt-lookup rows side by side), which is what the
  gateway serves;
- a request whose prompt prefix is reused from an earlier one's slot.

The engine's other tests compare batched with alone and speculative with standard, which a
forward wrong the same way everywhere passes; this suite compares with transformers, and
its negative controls show that a forward ignoring the per-layer window types fails it.
"""

from __future__ import annotations

import copy
from functools import cache

import pytest
import torch

from gateway.engine import DecodeRequest, Engine, LoadedModel, SamplingParams
from gateway.engine.batch import masks
from gateway.engine.batch.forward import _FACTS
from gateway.speed import wrap_fast
from gateway.speed.fast import compiled_of, lean_of
from tests.support.batch import Job, drive

from .support import BY_NAME, FAMILIES, WINDOW, tokenizer

NEW = 24  # tokens generated per prompt
LENGTHS = (37, 70, 101)  # prompt lengths: each several windows long


def _prompt(length: int, seed: int) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    eos = tokenizer().eos_token_id
    ids = torch.randint(0, len(tokenizer()), (length,), generator=gen).tolist()
    return tuple(i if i != eos else eos + 1 for i in ids)


PROMPTS = [_prompt(n, seed=n) for n in LENGTHS]


@cache
def target(name: str) -> LoadedModel:
    return wrap_fast(BY_NAME[name].build(seed=1), tokenizer())


@cache
def draft(name: str) -> LoadedModel:
    """The target with noise on every weight: a draft of the same family that is partly
    right (some tokens accepted, some rejected)."""
    model = copy.deepcopy(target(name).model)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return wrap_fast(model, tokenizer())


@cache
def reference(name: str, prompt: tuple[int, ...], new: int = NEW) -> tuple[int, ...]:
    """transformers' greedy `generate`: the new tokens, up to and with the first EOS."""
    model = target(name).model
    eos = tokenizer().eos_token_id
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
            eos_token_id=eos, pad_token_id=eos, attention_mask=torch.ones(1, len(prompt)),
        )  # fmt: skip
    return tuple(out[0, len(prompt) :].tolist())


def greedy(n: int = NEW) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n)


SPEC = {"mode": "speculative", "k_min": 1, "k_max": 5}
NAMES = [f.name for f in FAMILIES]


def test_the_prompts_outrun_every_window() -> None:
    """The suite means something only where a window hides part of each prompt."""
    assert min(LENGTHS) > 2 * WINDOW
    for f in FAMILIES:
        layout = masks.attention_layout(f.build().config)
        assert layout.window in (None, WINDOW)


@pytest.mark.parametrize("name", NAMES)
def test_standard_decoding_alone_equals_generate(name: str) -> None:
    engine = Engine(target(name))
    for prompt in PROMPTS:
        assert engine.run(DecodeRequest(prompt, greedy())).token_ids == reference(name, prompt)


@pytest.mark.parametrize("name", NAMES)
def test_speculative_decoding_alone_equals_generate(name: str) -> None:
    engine = Engine(target(name))
    accepted = rejected = 0
    for prompt in PROMPTS:
        ref = reference(name, prompt)
        spec = engine.run(DecodeRequest(prompt, greedy(), proposer="draft", **SPEC), draft(name))
        assert spec.token_ids == ref
        accepted += spec.stats.accepted
        rejected += spec.stats.rejected
        lookup = engine.run(DecodeRequest(prompt, greedy(), proposer="prompt_lookup", **SPEC))
        assert lookup.token_ids == ref
    assert accepted > 0 and rejected > 0  # the verifier both kept and threw away drafts


@pytest.mark.parametrize("name", NAMES)
def test_a_mixed_batch_gives_every_row_the_generate_output(name: str) -> None:
    engine = Engine(target(name))
    jobs = [
        Job(0, DecodeRequest(PROMPTS[2], greedy())),
        Job(0, DecodeRequest(PROMPTS[0], greedy(), proposer="draft", **SPEC), draft(name)),
        Job(2, DecodeRequest(PROMPTS[1], greedy(), proposer="prompt_lookup", **SPEC)),
        Job(5, DecodeRequest(PROMPTS[0], greedy())),
        Job(5, DecodeRequest(PROMPTS[1], greedy(), proposer="draft", **SPEC), draft(name)),
    ]
    batch = engine.batch(len(jobs))
    out = drive(batch, engine, jobs)
    assert batch.forwards < sum(r.stats.target_forwards for r in out)  # rows shared forwards
    for job, res in zip(jobs, out, strict=True):
        assert res.token_ids == reference(name, job.req.prompt_ids)


@pytest.mark.parametrize("name", NAMES)
def test_a_reused_prompt_prefix_gives_the_generate_output(name: str) -> None:
    """A second prompt that begins like the first reuses the first's keys and values
    (`cached_prompt_tokens`), past several windows, and still decodes what generate does."""
    engine = Engine(target(name))
    first, second = PROMPTS[2], (*PROMPTS[2][:80], *PROMPTS[0][:9])
    batch = engine.batch(2)
    one = drive(batch, engine, [Job(0, DecodeRequest(first, greedy(), cache_scope="t"))])[0]
    req = DecodeRequest(second, greedy(), cache_scope="t", proposer="draft", **SPEC)
    two = drive(batch, engine, [Job(0, req, draft(name))])[0]
    assert two.stats.cached_prompt_tokens >= 80
    assert one.token_ids == reference(name, first)
    assert two.token_ids == reference(name, second)


# -- negative controls: a forward that ignores the per-layer attention rules fails ----------


def _one_mask_for_every_layer(layout: masks.AttentionLayout, *args, **kwargs):  # type: ignore[no-untyped-def]
    """What the batch path did before per-layer masks: the config's one window applied to
    every layer, whatever the layer's type."""
    uniform = masks.AttentionLayout((masks.SLIDING,) * len(layout.kinds), layout.window)
    return REAL_LAYER_MASKS(uniform if layout.window else layout, *args, **kwargs)


def _no_window(layout: masks.AttentionLayout, *args, **kwargs):  # type: ignore[no-untyped-def]
    full = masks.AttentionLayout((masks.FULL,) * len(layout.kinds))
    return REAL_LAYER_MASKS(full, *args, **kwargs)


REAL_LAYER_MASKS = masks.layer_masks


@pytest.mark.parametrize(
    ("name", "broken"),
    [("gemma2", _one_mask_for_every_layer), ("gemma3", _one_mask_for_every_layer),
     ("gpt_oss", _one_mask_for_every_layer), ("mistral", _no_window),
     ("gemma3", _no_window)],
)  # fmt: skip
def test_a_forward_that_ignores_the_layer_types_fails_the_suite(
    name: str, broken, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.engine.batch import forward

    monkeypatch.setattr(forward, "layer_masks", broken)
    lm = wrap_fast(BY_NAME[name].build(seed=1), tokenizer())  # a fresh model: no kept facts
    _FACTS.pop(lm.model, None)
    engine = Engine(lm)
    jobs = [Job(0, DecodeRequest(p, greedy())) for p in PROMPTS]
    out = drive(engine.batch(4), engine, jobs)
    wrong = [r.token_ids != reference(name, p) for r, p in zip(out, PROMPTS, strict=True)]
    assert any(wrong)


LEAN = [n for n in NAMES if lean_of(target(n)) is not None]


def test_the_lean_decoder_serves_the_families_it_was_checked_for() -> None:
    assert set(LEAN) == {"llama3", "qwen2", "mistral"}  # qwen2-sliding mixes its layers


@pytest.mark.parametrize("name", LEAN)
def test_the_compiled_step_gives_the_generate_output(name: str) -> None:
    """The compiled step's function (speed/compiled.py `_step_of`: its own mask, joined
    projections), run without inductor: a mixed batch of standard and speculative rows
    (the draft's step compiled too) decodes what generate does."""
    from gateway.speed.warmup import CompileOptions, compiled_model

    fresh = wrap_fast(BY_NAME[name].build(seed=1), tokenizer())
    fast, _ = compiled_model(fresh, 4, options=CompileOptions(inductor=False))
    small, _ = compiled_model(draft(name), 4, draft=True, options=CompileOptions(inductor=False))
    assert compiled_of(fast) is not None and compiled_of(small) is not None
    engine = Engine(fast)
    jobs = [
        Job(0, DecodeRequest(PROMPTS[2], greedy())),
        Job(1, DecodeRequest(PROMPTS[0], greedy(), proposer="draft", **SPEC), small),
        Job(3, DecodeRequest(PROMPTS[1], greedy(), proposer="prompt_lookup", **SPEC)),
    ]
    out = drive(engine.batch(4), engine, jobs)
    for job, res in zip(jobs, out, strict=True):
        assert res.token_ids == reference(name, job.req.prompt_ids)
