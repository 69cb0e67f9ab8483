"""Unit tests of the small parts: cache cropping, detokenizer, stop strings, k policy,
proposers."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from gateway.costmodel import best_k, expected_tokens
from gateway.costmodel import expected_speedup as speedup
from gateway.engine import crop_cache
from gateway.engine.detok import IncrementalDetokenizer, TextOutput
from gateway.engine.kpolicy import KPolicy
from gateway.engine.proposers import PredictionProposer, PromptLookupProposer

# -- KV cache ------------------------------------------------------------------------------


def test_crop_cache_to_a_length(llama_lm) -> None:
    cache = DynamicCache()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        full = llama_lm.model(input_ids=ids, cache=cache, use_cache=True).logits
        assert cache.get_seq_length() == 6
        crop_cache(cache, 4)
        assert cache.get_seq_length() == 4
        crop_cache(cache, 4)  # no-op
        assert cache.get_seq_length() == 4
        again = llama_lm.model(input_ids=ids[:, 4:], cache=cache, use_cache=True).logits
    torch.testing.assert_close(again[0], full[0, 4:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        crop_cache(cache, 7)


def test_dynamic_cache_crop_semantics_we_rely_on() -> None:
    """transformers 5.24: crop(-n) drops the last n positions; a positive value raises."""
    cache = DynamicCache()
    k = torch.zeros(1, 2, 5, 4)
    cache.update(k, k, 0)
    cache.crop(-2)
    assert cache.get_seq_length() == 3
    with pytest.raises(ValueError):
        cache.crop(2)


# -- detokenizer and stop strings ----------------------------------------------------------


def test_partial_utf8_is_held_back(tokenizer) -> None:
    text = "a €5 ü"  # '€' is not in the BPE corpus: three byte tokens
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    euro_parts = tokenizer("€", add_special_tokens=False)["input_ids"]
    assert len(euro_parts) == 3
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces.count("") >= 2  # the first two bytes of '€' produced nothing


def test_detokenizer_joins_after_prompt_context(tokenizer) -> None:
    prompt = tokenizer("def add(a", add_special_tokens=False)["input_ids"]
    out = tokenizer(", b):\n    return a + b", add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, tuple(prompt))
    text = "".join(detok.push(i) for i in out) + detok.flush()
    assert text == tokenizer.decode(out)


def test_stop_prefix_is_held_back_then_released() -> None:
    out = TextOutput(("STOP",))
    out.add("hello ST")
    assert out.releasable() == "hello "
    out.add("OMP")  # not a stop after all
    assert out.releasable() == "STOMP"
    out.add(" and ST")
    out.add("OP here")
    assert out.stopped and out.text == "hello STOMP and "
    assert out.release_all() == " and "


def test_stop_string_across_many_pieces() -> None:
    out = TextOutput(("<end>", "xyz"))
    for ch in "ab<en":
        out.add(ch)
    assert out.releasable() == "ab"
    out.add("d>tail")
    assert out.stopped and out.text == "ab"


# -- k policy ------------------------------------------------------------------------------


def test_expected_tokens_and_speedup() -> None:
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert speedup(0.8, 4, 0.1) == pytest.approx(expected_tokens(0.8, 4) / 1.4)


def test_best_k_follows_the_cost_model() -> None:
    assert best_k(0.99, 0.0, 1, 8)[0] == 8  # free drafts: as long as allowed
    assert best_k(0.1, 0.5, 1, 8)[0] == 1  # poor acceptance, costly draft: shortest
    a, c = 0.8, 0.1
    k = best_k(a, c, 1, 16)[0]
    assert all(speedup(a, k, c) >= speedup(a, j, c) for j in range(1, 17))
    assert 2 <= k <= 8


def test_kpolicy_adapts_to_acceptance() -> None:
    pol = KPolicy(1, 8, c=0.2)
    start = pol.choose()
    for _ in range(10):
        pol.update(4, 0)
    assert pol.acceptance < 0.3 and pol.choose() < start
    for _ in range(30):
        pol.update(4, 4)
    assert pol.acceptance > 0.9 and pol.choose() >= start


def test_kpolicy_keeps_static_c_when_told() -> None:
    pol = KPolicy(1, 8, c=0.1, measure_c=False)
    pol.observe_c(0.9)
    assert pol.c == 0.1
    pol = KPolicy(1, 8, c=0.1)
    pol.observe_c(0.9)
    assert pol.c == 0.9


# -- proposers -----------------------------------------------------------------------------


def test_prompt_lookup_copies_latest_longest_match() -> None:
    prop = PromptLookupProposer()
    ctx = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert prop.propose(ctx, 3).tokens == [7, 8, 5]  # the latest earlier "1 2 3"
    assert prop.propose([*ctx, 7], 2).tokens == [8, 5]
    assert prop.propose([4, 5, 6], 3).tokens == []
    assert PromptLookupProposer().propose([4, 5, 4], 3).tokens == [5, 4]  # 1-gram fallback
    assert prop.propose(ctx, 3).probs is None  # one-hot


def test_prediction_follows_diverges_and_realigns() -> None:
    pred = [10, 11, 12, 13, 14, 15, 16, 17]
    prompt = [1, 2]
    prop = PredictionProposer(pred, prompt_len=len(prompt))
    assert prop.propose(prompt, 3).tokens == [10, 11, 12]
    assert prop.propose([*prompt, 10, 11], 3).tokens == [12, 13, 14]
    assert prop.propose([*prompt, 10, 11, 99], 3).tokens == []  # diverged, nothing to align
    assert prop.propose([*prompt, 10, 11, 99, 13, 14], 2).tokens == [15, 16]  # re-aligned
    assert prop.propose([*prompt, 10, 11, 99, 13, 14, 15, 16, 17], 3).tokens == []  # the end
