# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""Exactness on the llama.cpp backend, measured: the engine's loop, verifier, proposers,
grammars, logprobs and stop handling run unchanged on llama.cpp's logits.

- Greedy speculative decoding gives standard decoding's tokens, token for token, whatever
  proposes (the target's own GGUF as its draft: every draft accepted, verify forwards of
  k + 1 tokens; a smaller random GGUF draft: rejections and rollbacks; prompt lookup).
- A request's tokens in a mixed batch (standard, draft, prompt lookup, a grammar, logprobs,
  stop strings; rows joining and leaving) are its tokens alone (a batch of one row), or
  where they part, the parting is a near tie: llama.cpp's kernels round a row by batch
  shape, as torch's do (`assert_same_or_near_tie`).

"Alone" is a one-row batch: a llama.cpp model decodes through the batch path only.
"""

from __future__ import annotations

import pytest
import torch

from .conftest import needs_llama_cpp

needs_llama_cpp()

from gateway.engine import DecodeRequest, DecodeResult, Engine, LoadedModel, SamplingParams
from gateway.engine.backends.base import slot_cache
from gateway.engine.batch.forward import Step, batched_forward
from gateway.engine.schema import Delta, Finished
from tests.support.batch import PROMPTS, Job, drive, greedy, mixed_jobs

NEAR_TIE = 1e-3  # logit gap between the two tokens where a parting may come (f16 KV)
SPEC = {"mode": "speculative", "k_min": 1, "k_max": 5}


def alone(engine: Engine, req: DecodeRequest, draft: LoadedModel | None = None) -> DecodeResult:
    return drive(engine.batch(1), engine, [Job(0, req, draft)])[0]


def parting(lm: LoadedModel, prompt: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]):
    """Where outputs a and b part: (index, logit gap between the two tokens there, computed
    by one fresh forward over the common context); None when one is a prefix of the other."""
    i = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if i is None:
        return None
    cache = slot_cache(lm.model, 1, lm.context_length)
    ctx = [*prompt, *a[:i]]
    z = batched_forward(lm.model, Step(cache, [cache.take()], [ctx], keep_last=True))[0][0]
    return i, abs(float(z[a[i]] - z[b[i]]))


def assert_same_or_near_tie(lm: LoadedModel, prompt, got: DecodeResult, want: DecodeResult):
    if got.token_ids == want.token_ids:
        return
    where = parting(lm, tuple(prompt), got.token_ids, want.token_ids)
    assert where is not None, (got.token_ids, want.token_ids)
    assert where[1] < NEAR_TIE, f"parted at token {where[0]} with a logit gap of {where[1]:.2e}"


@pytest.mark.parametrize("proposer", ["self", "draft", "prompt_lookup"])
def test_greedy_speculative_equals_standard(cpp_target, cpp_draft, proposer) -> None:
    engine = Engine(cpp_target)
    draft = {"self": cpp_target, "draft": cpp_draft, "prompt_lookup": None}[proposer]
    name = "prompt_lookup" if proposer == "prompt_lookup" else "draft"
    accepted = 0
    for prompt in PROMPTS:
        std = alone(engine, DecodeRequest(prompt, greedy(40)))
        spec = alone(engine, DecodeRequest(prompt, greedy(40), proposer=name, **SPEC), draft)
        assert spec.token_ids == std.token_ids, (proposer, prompt)
        assert spec.stats.target_forwards <= std.stats.target_forwards
        accepted += spec.stats.accepted
    if proposer == "self":  # the target drafting for itself: every draft is accepted
        assert accepted > 0


def test_a_mixed_batch_gives_every_row_its_alone_output(cpp_target, cpp_draft) -> None:
    engine = Engine(cpp_target)
    jobs = mixed_jobs(engine, cpp_draft)
    jobs.append(Job(2, DecodeRequest(PROMPTS[1], SamplingParams(
        temperature=0.0, max_tokens=24, logprobs=True, top_logprobs=3, stop=("a",)))))  # fmt: skip
    batch = engine.batch(8)
    together = drive(batch, engine, jobs)
    assert batch.forwards < sum(r.stats.target_forwards for r in together)  # shared forwards
    fresh = mixed_jobs(engine, cpp_draft)  # a grammar is stateful: new ones for the alone runs
    for job, again, got in zip(jobs, [*fresh, jobs[-1]], together, strict=True):
        want = alone(engine, again.req, again.draft)
        assert_same_or_near_tie(cpp_target, job.req.prompt_ids, got, want)
        if got.token_ids == want.token_ids and got.logprobs:
            for a, b in zip(got.logprobs, want.logprobs, strict=True):
                assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-3


def test_a_sampled_seeded_row_gives_its_alone_output(cpp_target, cpp_draft) -> None:
    engine = Engine(cpp_target)
    sp = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=30, seed=7)
    req = DecodeRequest(PROMPTS[0], sp, proposer="draft", **SPEC)
    jobs = [Job(0, req, cpp_draft), Job(0, DecodeRequest(PROMPTS[2], greedy(30)))]
    got = drive(engine.batch(4), engine, jobs)[0]
    want = alone(engine, req, cpp_draft)
    assert got.token_ids == want.token_ids


def test_a_kept_prompt_prefix_is_reused_with_the_same_output(cpp_target) -> None:
    engine = Engine(cpp_target)
    prompt = tuple(range(3, 40))
    req = DecodeRequest(prompt, greedy(12), cache_scope="tenant-a")
    first = alone(engine, req)
    batch = engine.batch(2)
    a = drive(batch, engine, [Job(0, req)])[0]
    b = drive(batch, engine, [Job(0, req)])[0]
    assert a.stats.cached_prompt_tokens == 0 and b.stats.cached_prompt_tokens >= 16
    assert a.token_ids == first.token_ids
    assert_same_or_near_tie(cpp_target, prompt, b, first)


def test_costs_are_probed_on_the_backend(cpp_target, cpp_draft) -> None:
    engine = Engine(cpp_target)
    costs = engine.measure_costs(4)
    assert costs.standard_step(1) and costs.standard_step(4)
    assert engine.measure_costs(4, cpp_draft).seconds(1, 1)
    step = engine.cost_at(4, 3, cpp_draft)
    assert step is not None and len(step.verify) == 4 and step.draft_c is not None
    assert torch.get_num_threads() >= 1


def test_engine_run_decodes_a_llama_cpp_model_in_a_batch_of_its_own(cpp_target) -> None:
    """Engine.stream / run (the regression gate's path) run a backend's model as a one-row
    batch: the same tokens and events as the batch path alone."""
    engine = Engine(cpp_target)
    req = DecodeRequest(PROMPTS[0], greedy(16))
    items = list(engine.stream(req))
    assert isinstance(items[-1], Finished)
    assert items[-1].result.token_ids == alone(engine, req).token_ids
    assert "".join(d.text for d in items if isinstance(d, Delta)) == items[-1].result.text
