# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""Parked rows on the llama.cpp backend (Batch.park / resume: the serving layer's
preemption, serving/fairness.py): a slot is saved as llama.cpp's copy of its sequence
(`llama_state_seq_get_data`) and restored into whichever slot is free. The random parking
pattern of tests/unit/engine/test_batch_parked.py (three slots, six mixed rows, parked
while prefilling or decoding) gives each row its output alone, or a near-tie parting as any
batch does on llama.cpp (test_exactness.py). The negative control restores sequences whose last
position holds another token: outputs then part beyond near ties."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from .conftest import needs_llama_cpp

needs_llama_cpp()


from gateway.engine import Engine, LoadedModel
from gateway.engine.backends.llamacpp import LlamaCppCache
from gateway.engine.batch.slots import Saved
from tests.support.batch import mixed_jobs
from tests.unit.engine.llamacpp.test_exactness import NEAR_TIE, alone, parting
from tests.unit.engine.test_batch_parked import _drive_parking


def _gaps(engine: Engine, lm: LoadedModel, draft: LoadedModel) -> tuple[int, list[float]]:
    """(rows parked, the logit gap at each row's parting from its output alone)."""
    jobs = mixed_jobs(engine, draft)
    solo = [alone(engine, j.req, j.draft) for j in jobs]
    results, parks, prefilling = _drive_parking(engine, mixed_jobs(engine, draft), False)
    assert prefilling >= 1  # one row was parked mid-prompt
    gaps = []
    for j, want in enumerate(solo):
        where = parting(lm, tuple(jobs[j].req.prompt_ids), results[j].token_ids, want.token_ids)
        gaps += [] if where is None else [where[1]]
    return parks, gaps


def test_parked_rows_decode_what_they_decode_alone(cpp_target, cpp_draft) -> None:
    parks, gaps = _gaps(Engine(cpp_target), cpp_target, cpp_draft)
    assert parks >= 8
    assert all(g < NEAR_TIE for g in gaps), gaps


@pytest.fixture
def last_position_swapped(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Saved sequences whose last position holds another token's keys and values (token 0
    fed there instead of the row's: an off-by-one in what is copied)."""
    save = LlamaCppCache.save

    def swapped(self: LlamaCppCache, slot: int) -> Saved:
        saved = save(self, slot)
        n = saved.length
        if n > 1:
            self.length[slot] = n - 1
            self.forward([slot], [[0]], keep_last=True, logits=False)
            self.length[slot] = n
            saved = Saved(n, [self._state(slot)], [])
        return saved

    monkeypatch.setattr(LlamaCppCache, "save", swapped)
    yield


def test_control_restored_sequences_with_another_last_token_decode_otherwise(
    cpp_target, cpp_draft, last_position_swapped
) -> None:
    _, gaps = _gaps(Engine(cpp_target), cpp_target, cpp_draft)
    assert any(g >= NEAR_TIE for g in gaps), gaps


def test_a_restored_sequence_gives_the_saved_one_s_logits(cpp_target) -> None:
    cache = cpp_target.model.slot_cache(3, 64)
    a, b, c = cache.take(), cache.take(), cache.take()
    cache.forward([a, c], [[5, 6, 7, 8], [1, 2, 3, 4]], keep_last=True)
    cache.length[a] = 3  # the fourth token was a rejected draft: not part of the copy
    cache.length[c] = 4
    saved, other = cache.save(a), cache.save(c)
    assert saved.length == 3 and saved.nbytes > 0 and cache.held[a] == 3
    cache.restore(b, saved)
    assert cache.length[b] == cache.held[b] == 3
    cache.copy_prefix(b, c, 2)  # a prefix of it moved on at once, and then, before any
    cache.restore(b, other)  # decode, b given another row: c keeps what b held before
    cache.length[c] = 2
    cache.forward([c], [[7]], keep_last=True)
    cache.length[c] = 3
    want, got = cache.forward([a, c], [[9], [9]], keep_last=True)
    assert torch.equal(got, want)
