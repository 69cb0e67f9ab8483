# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""The llama.cpp backend's forward keeps the batch path's slot contract (backends/base.py).

Each test states what a row's logits must equal: the torch model the GGUF was written from
(a conversion or layout error shows as a large difference), the same row's logits computed
another way (rolled back and fed again, copied into another slot, beside other rows).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .conftest import needs_llama_cpp

needs_llama_cpp()

from gateway.engine import LoadedModel
from gateway.engine.backends.base import BackendCache, slot_cache
from gateway.engine.backends.llamacpp import LlamaCppCache, load_gguf
from gateway.engine.batch.forward import Step, batched_forward

PROMPT = [10, 20, 30, 40, 50, 60, 70]


def _forward(
    lm: LoadedModel, cache: BackendCache, slots: list[int], feeds: list[list[int]],
    keep_last: bool = False, commit: bool = True,
) -> list[torch.Tensor]:  # fmt: skip
    out = batched_forward(lm.model, Step(cache, slots, feeds, keep_last=keep_last))
    if commit:
        for s, f in zip(slots, feeds, strict=True):
            cache.length[s] += len(f)
    return out


def test_logits_match_the_torch_model_it_was_written_from(llama_lm, gguf_files, model_dirs):
    """f32 weights, f32 KV: llama.cpp's logits over a prompt equal the torch model's up to
    its kernels' rounding (measured 1.3e-3 at most on logits of about 1: llama.cpp rounds
    some intermediates to lower precision), while a wrong tensor layout or rotary convention
    would differ by O(1)."""
    lm = load_gguf(gguf_files["llama"], tokenizer=model_dirs["llama"], threads=1, kv_type="f32")
    cache = slot_cache(lm.model, 2, lm.context_length)
    assert isinstance(cache, LlamaCppCache)
    got = _forward(lm, cache, [cache.take()], [PROMPT])[0]  # (T, V)
    with torch.inference_mode():
        ref = llama_lm.model(input_ids=torch.tensor([PROMPT])).logits[0]  # (T, V)
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert torch.allclose(got, ref, atol=5e-3, rtol=0), float((got - ref).abs().max())
    top2 = ref.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 1e-2  # the same greedy token where it is no near tie
    assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])


def test_rows_keep_their_own_positions_and_sequences(cpp_target):
    """Rows of different lengths in one forward get what each gets alone: one token, several,
    the last only (keep_last)."""
    lm = cpp_target
    alone = slot_cache(lm.model, 1, lm.context_length)
    ref = [_forward(lm, alone, [alone.take()], [PROMPT])[0]]
    a = slot_cache(lm.model, 1, lm.context_length)
    a.take()
    ref.append(_forward(lm, a, [0], [[5, 6, 7]])[0])
    cache = slot_cache(lm.model, 3, lm.context_length)
    slots = [cache.take() for _ in range(3)]
    both = _forward(lm, cache, slots[:2], [PROMPT, [5, 6, 7]])
    for got, want in zip(both, ref, strict=True):
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())
    last = _forward(lm, cache, slots, [[1, 2], [3], [9, 8, 7]], keep_last=True)
    assert [x.shape[0] for x in last] == [1, 1, 1]


def test_rollback_is_sequence_removal(cpp_target):
    """A rejected draft's entries are dropped when the slot's length is lowered: feeding other
    tokens after them gives the logits of a slot that never saw them."""
    lm = cpp_target
    cache = slot_cache(lm.model, 2, lm.context_length)
    s = cache.take()
    _forward(lm, cache, [s], [PROMPT])
    _forward(lm, cache, [s], [[90, 91, 92, 93]])  # a draft, then rejected:
    cache.length[s] = len(PROMPT) + 1  # 90 accepted, 91-93 rolled back
    got = _forward(lm, cache, [s], [[7, 8]])[0]
    fresh = slot_cache(lm.model, 1, lm.context_length)
    want = _forward(lm, fresh, [fresh.take()], [[*PROMPT, 90, 7, 8]])[0][-2:]
    assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())


def test_a_prefix_copied_between_slots_serves_the_next_row(cpp_target):
    """copy_prefix (kept prompts, a leaving row moved into a lower slot): the destination
    continues as the source would."""
    lm = cpp_target
    cache = slot_cache(lm.model, 3, lm.context_length)
    src, dst = cache.take(), cache.take()
    _forward(lm, cache, [src, dst], [PROMPT, [1, 2, 3, 4, 5, 6, 7, 8, 9]])
    cache.copy_prefix(src, dst, 5)
    cache.length[dst] = 5
    got = _forward(lm, cache, [dst], [[33, 34]])[0]
    fresh = slot_cache(lm.model, 1, lm.context_length)
    want = _forward(lm, fresh, [fresh.take()], [[*PROMPT[:5], 33, 34]])[0][-2:]
    assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())
    cache.move(src, 2)  # the source's whole context into a free slot
    assert cache.length[2] == len(PROMPT) and cache.length[src] == 0


def test_a_forward_larger_than_one_llama_batch_is_decoded_in_parts(cpp_target):
    lm = cpp_target
    cache = slot_cache(lm.model, 2, lm.context_length)
    assert isinstance(cache, LlamaCppCache)
    cache._n_batch = 5  # parts of 5 tokens: rows split across llama_decode calls
    slots = [cache.take(), cache.take()]
    got = _forward(lm, cache, slots, [PROMPT, [4, 5, 6]])
    assert cache.decodes > 1  # in parts
    fresh = slot_cache(lm.model, 2, lm.context_length)
    want = _forward(lm, fresh, [fresh.take(), fresh.take()], [PROMPT, [4, 5, 6]])
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-4)


def test_writing_past_a_slot_is_refused(cpp_target):
    lm = cpp_target
    cache = slot_cache(lm.model, 1, 8)
    with pytest.raises(ValueError, match="capacity"):
        _forward(lm, cache, [cache.take()], [list(range(1, 10))])


def test_the_single_request_path_says_to_use_a_batch(cpp_target):
    with pytest.raises(NotImplementedError, match="batch"):
        cpp_target.model(input_ids=None)


def _after_another_row(lm: LoadedModel, unified: bool) -> torch.Tensor:
    """Row a's logits over 10 one-token steps, in a cache where row b's 80 cells were used
    and freed before a came, and b steps beside a."""
    cache = LlamaCppCache(lm.model, 2, 256, unified=unified)
    b, a = cache.take(), cache.take()
    _forward(lm, cache, [b], [list(range(100, 180))])
    _forward(lm, cache, [a], [list(range(10, 50))])
    cache.length[b] = 0  # b leaves; a new row b starts
    _forward(lm, cache, [b], [[7]])
    steps = [_forward(lm, cache, [a, b], [[60 + i], [70 + i]])[0] for i in range(10)]
    return torch.cat(steps)


def _alone(lm: LoadedModel, unified: bool) -> torch.Tensor:
    cache = LlamaCppCache(lm.model, 2, 256, unified=unified)
    a = cache.take()
    _forward(lm, cache, [a], [list(range(10, 50))])
    return torch.cat([_forward(lm, cache, [a], [[60 + i]])[0] for i in range(10)])


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_a_rows_logits_do_not_depend_on_the_other_rows(cpp_target, model_dirs, tmp_path, kind):
    """Each sequence keeps its own KV stream: a row gets the same logits alone and after
    another row's cells came and went, with that row stepping beside it (bitwise at Q8_0,
    and measured bitwise at f32 too, where a two-row product may round differently from a
    one-row one). The negative control: in one shared pool of cells (unified) the row's
    logits move (3.7e-3 at f32, 4.1e-2 at Q8_0 measured)."""
    from models_registry.gguf import quantize

    path = Path(cpp_target.path)
    if kind != "f32":
        path = quantize(path, tmp_path / f"{kind}.gguf", kind)
    lm = load_gguf(path, tokenizer=model_dirs["llama"], threads=1)
    own = (_after_another_row(lm, unified=False) - _alone(lm, unified=False)).abs().max()
    shared = (_after_another_row(lm, unified=True) - _alone(lm, unified=True)).abs().max()
    assert float(own) <= (0.0 if kind == "q8_0" else 1e-4), float(own)
    assert float(shared) > float(own), (float(shared), float(own))
