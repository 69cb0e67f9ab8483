"""The target's hidden states a step's FeatureTap hands back (batch/forward.py): the same as
transformers' hidden_states at the fed positions, on the eager path and the lean decoder's
(gateway/speed), and not computed at all by a step without a tap."""

from __future__ import annotations

import copy

import pytest
import torch

from gateway.engine import DecodeRequest, Engine, SamplingParams
from gateway.engine.backends.base import slot_cache
from gateway.engine.batch.forward import FeatureTap, Step, batched_forward
from gateway.engine.batch.head_drafting import step_tap
from gateway.speed import wrap_fast
from gateway.speed.fast import lean_of
from tests.support.models import CONTEXT, build_tokenizer, llama

TOKENIZER = build_tokenizer()
VOCAB, EOS = len(TOKENIZER), TOKENIZER.eos_token_id
ROWS = [[5, 6, 7, 8, 9], [11, 12], [40, 41, 42]]


def reference(model, ids: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    with torch.inference_mode():
        res = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([res.hidden_states[i][0] for i in layers], dim=-1)


def tapped_steps(lm, layers: tuple[int, ...]) -> list[torch.Tensor]:
    """Each row's states over two steps (a prefill of all but 2 tokens, then 2 more), as
    the tap hands them back."""
    cache = slot_cache(lm.model, len(ROWS), CONTEXT, pad=16)
    got: list[list[torch.Tensor]] = [[] for _ in ROWS]
    with torch.inference_mode():
        for part in (slice(0, -2), slice(-2, None)):
            feeds = [r[part] for r in ROWS]
            tap = FeatureTap(layers)
            step = Step(cache, list(range(len(ROWS))), feeds, tap=tap)
            batched_forward(lm.model, step, lm.fast)
            for i, f in enumerate(feeds):
                cache.length[i] += len(f)
                got[i].append(tap.of(i, layers))
    return [torch.cat(g) for g in got]


@pytest.mark.parametrize("lean", [False, True])
def test_a_tap_hands_back_transformers_hidden_states(lean) -> None:
    model = llama(VOCAB, EOS, seed=7, layers=3, init=0.3)
    lm = wrap_fast(copy.deepcopy(model), TOKENIZER) if lean else wrap_fast(model, TOKENIZER)
    if lean:
        assert lean_of(lm) is not None
    else:
        object.__setattr__(lm, "fast", None)  # the model's own forward
    layers = (0, 2, 3)  # the embeddings, after layer 2, the last (after the final norm)
    for row, got in zip(ROWS, tapped_steps(lm, layers), strict=True):
        ref = reference(lm.model, row, layers)
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        # the check is sharp: another layer's states are not these
        assert not torch.allclose(got, reference(lm.model, row, (0, 1, 3)), atol=1e-3)
    sub = tapped_steps(lm, layers)[0]
    tap_of = FeatureTap(layers, [sub])
    torch.testing.assert_close(tap_of.of(0, (3,)), reference(lm.model, ROWS[0], (3,)), atol=1e-4,
                               rtol=1e-4)  # fmt: skip


def test_standard_steps_compute_no_hidden_states(monkeypatch) -> None:
    """Rows without a head: no tap, and the forward is not asked for hidden states."""
    lm = wrap_fast(llama(VOCAB, EOS, seed=8, init=0.3), TOKENIZER)
    object.__setattr__(lm, "fast", None)
    eng = Engine(lm)
    asked: list[bool] = []
    forward = type(lm.model).forward

    def spy(self, *args, **kw):
        asked.append(bool(kw.get("output_hidden_states")))
        return forward(self, *args, **kw)

    monkeypatch.setattr(type(lm.model), "forward", spy)
    cfgs = [eng.prepare(DecodeRequest((3, 4, 5), SamplingParams(temperature=0.0, max_tokens=4)))]
    assert step_tap(cfgs) is None
    batch = eng.batch(2)
    batch.add(cfgs[0])
    while batch.rows:
        batch.step()
    assert asked and not any(asked)


class CompiledThatRefuses:
    """Stands in for a model's compiled forwards: records being asked, serves nothing."""

    def __init__(self) -> None:
        self.asked = 0

    def serves(self, *args) -> bool:
        self.asked += 1
        return False


@pytest.mark.parametrize("tapped", [True, False])
def test_a_tapped_step_skips_the_compiled_forward_and_runs_lean(tapped) -> None:
    """A compiled step returns logits only, so a step with a tap goes to the lean decoder,
    which fills the tap; the control: a step without one is offered to the compiled one."""
    from gateway.speed.fast import Accelerated

    lm = wrap_fast(llama(VOCAB, EOS, seed=9, init=0.3), TOKENIZER)
    compiled = CompiledThatRefuses()
    fast = Accelerated(lean=lean_of(lm), compiled=compiled)  # type: ignore[arg-type]
    object.__setattr__(lm, "fast", fast)
    cache = slot_cache(lm.model, 1, CONTEXT, pad=16)
    tap = FeatureTap((1, 2)) if tapped else None
    with torch.inference_mode():
        batched_forward(lm.model, Step(cache, [0], [[4, 5, 6]], tap=tap), lm.fast)
    assert (compiled.asked == 0) is tapped
    if tap is not None:
        torch.testing.assert_close(tap.of(0, (1, 2)), reference(lm.model, [4, 5, 6], (1, 2)),
                                   atol=1e-4, rtol=1e-4)  # fmt: skip
