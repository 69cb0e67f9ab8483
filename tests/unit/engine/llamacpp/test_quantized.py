# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""Quantized GGUF models as users have them (models_registry/gguf.py): the tiny Llama and its
draft quantized by llama.cpp to Q8_0 and Q4_K_M serve through the same batch path. Greedy
speculative decoding gives standard decoding's tokens on each quantization (exactness does
not depend on the weights' type); a quantized model's logits stay near the f32 model's, at
a distance growing with fewer bits (the negative control: Q4_K_M's distance exceeds Q8_0's);
quantizing is deterministic. And a token's logits do not depend on how many tokens its
forward holds: the backend keeps decode and verify forwards off ggml's tiled K-quant
products, whose logits differ (the negative control: a forward in one call sees the
difference); prompts on them: test_tiled.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .conftest import needs_llama_cpp

needs_llama_cpp()

from gateway.engine import DecodeRequest, Engine, LoadedModel, SamplingParams
from gateway.engine.backends.llamacpp import load_gguf
from models_registry.gguf import quantize, sha256

PROMPTS = ((5, 6, 7, 8), (40, 41, 42, 43, 44, 45), (100, 3, 100, 3, 100))
KINDS = ("q8_0", "q4_k_m")


@pytest.fixture(scope="module")
def quantized(
    gguf_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Path]]:
    """{kind: {"llama": path, "draft": path}}, f32 among the kinds."""
    root = tmp_path_factory.mktemp("quantized")
    out = {"f32": dict(gguf_files)}
    for kind in KINDS:
        out[kind] = {
            n: quantize(gguf_files[n], root / f"{n}-{kind}.gguf", kind) for n in gguf_files
        }
    return out


def _load(path: Path, model_dir: Path) -> LoadedModel:
    return load_gguf(path, tokenizer=model_dir, threads=1, kv_type="f32")


def _logits(lm: LoadedModel, prompt: tuple[int, ...]) -> torch.Tensor:
    from gateway.engine.backends.base import slot_cache

    cache = slot_cache(lm.model, 1, lm.context_length)
    slot = cache.take()
    return cache.forward([slot], [list(prompt)], keep_last=False)[0]


@pytest.mark.parametrize("kind", ["f32", *KINDS])
def test_greedy_speculative_equals_standard_on_each_quantization(quantized, model_dirs, kind):
    target = _load(quantized[kind]["llama"], model_dirs["llama"])
    draft = _load(quantized[kind]["draft"], model_dirs["draft"])
    engine = Engine(target)
    accepted = rejected = 0
    for prompt in PROMPTS:
        greedy = SamplingParams(temperature=0.0, max_tokens=24)
        std = engine.run(DecodeRequest(prompt, greedy))
        spec = engine.run(
            DecodeRequest(prompt, greedy, mode="speculative", proposer="draft", k_min=1, k_max=4),
            draft,
        )
        assert spec.token_ids == std.token_ids, (kind, prompt)
        accepted += spec.stats.accepted
        rejected += spec.stats.drafted - spec.stats.accepted
    assert rejected > 0  # the draft was wrong too: rollbacks happened


def test_quantized_logits_stay_near_f32_and_fewer_bits_drift_further(quantized, model_dirs):
    ref = _load(quantized["f32"]["llama"], model_dirs["llama"])
    prompt = PROMPTS[1]
    want = _logits(ref, prompt)
    dist = {}
    for kind in KINDS:
        got = _logits(_load(quantized[kind]["llama"], model_dirs["llama"]), prompt)
        assert got.shape == want.shape
        dist[kind] = float((got - want).abs().max())
    scale = float(want.abs().max())
    assert 0 < dist["q8_0"] < dist["q4_k_m"] < scale, (dist, scale)


def test_quantizing_is_deterministic(gguf_files, tmp_path):
    a = quantize(gguf_files["llama"], tmp_path / "a.gguf", "q4_k_m")
    b = quantize(gguf_files["llama"], tmp_path / "b.gguf", "q4_k_m")
    assert sha256(a) == sha256(b) != sha256(gguf_files["llama"])


def shape_gap(path: Path) -> float:
    """The largest difference between the logits of 12 tokens fed one per forward and fed in
    one forward, after the same 40-token prompt."""
    lm = _load(path, path.parent)
    prompt, more = list(range(3, 43)), list(range(50, 62))
    cache = lm.model.slot_cache(2, 128)
    one, many = cache.take(), cache.take()
    for s in (one, many):
        cache.forward([s], [prompt], keep_last=True)
        cache.length[s] += len(prompt)
    singles = []
    for t in more:
        singles.append(cache.forward([one], [[t]], keep_last=False)[0])
        cache.length[one] += 1
    together = cache.forward([many], [more], keep_last=False)[0]
    return float((torch.cat(singles) - together).abs().max())


def test_a_tokens_logits_do_not_depend_on_its_forwards_size(wide_q4) -> None:
    """Decode and verify forwards go to llama.cpp at most DECODE_PART (7) tokens a call:
    from 8 ggml's tiled K-quant products serve them, whose logits differ."""
    assert _load(wide_q4, wide_q4.parent).model.tiled  # the tiled products are on here
    assert shape_gap(wide_q4) == 0.0


def test_with_the_tiled_products_on_they_differ(wide_q4, monkeypatch) -> None:
    """The negative control: a forward's tokens in one call, the tiled products take it."""
    from gateway.engine.backends import llamacpp_calls

    monkeypatch.setattr(llamacpp_calls, "DECODE_PART", 1000)
    assert shape_gap(wide_q4) > 1e-3


def _long_gap(path: Path) -> float:
    """The largest difference between the logits of 12 tokens decoded after a 90-token
    prompt chunk fed in one prompt forward and fed in prompt forwards of 9 tokens (on the
    tiled products both: they give a token the same result in either)."""
    lm = _load(path, path.parent)
    toks = [3 + (7 * i) % 250 for i in range(98)]
    cache = lm.model.slot_cache(2, 256)
    whole, pieces = cache.take(), cache.take()
    for s, size in ((whole, 90), (pieces, 9)):
        for at in [0, *range(8, 98, size)]:
            part = toks[at : 8 if at == 0 else at + size]
            cache.forward([s], [part], keep_last=True, prompt=True)
            cache.length[s] += len(part)
    out = {}
    for s in (whole, pieces):
        out[s] = torch.cat([_step(cache, s, t) for t in range(50, 62)])
    return float((out[whole] - out[pieces]).abs().max())


def _step(cache, slot: int, token: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    z = cache.forward([slot], [[token]], keep_last=False)[0]
    cache.length[slot] += 1
    return z


def test_a_long_forward_gives_each_token_its_short_forwards_logits(deep_q4, monkeypatch):
    """A row's tokens go to llama.cpp ROW_PART (63) at a time: from 64 query tokens of one
    sequence ggml's flash attention takes a tiled path with other logits. The negative
    control: with the rows fed whole, the same comparison differs."""
    from gateway.engine.backends import llamacpp_calls

    assert _long_gap(deep_q4) == 0.0
    monkeypatch.setattr(llamacpp_calls, "ROW_PART", 1000)
    assert _long_gap(deep_q4) > 1e-3
