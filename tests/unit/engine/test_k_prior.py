"""The k policy starts from the decision's prior (acceptance, c); a seeded sampled request
keeps the fixed prior, so its seed alone decides its output."""

from __future__ import annotations

import pytest

from gateway.costmodel import best_k
from gateway.engine import DecodeRequest, Engine, KPrior, SamplingParams
from gateway.engine.kpolicy import DEFAULT_PRIOR, static_c

PROMPT = (10, 20, 30, 40, 50)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
SEEDED = SamplingParams(temperature=0.9, max_tokens=24, seed=7)


@pytest.fixture(scope="module")
def eng(llama_lm) -> Engine:
    return Engine(llama_lm)


def first_k(eng: Engine, draft, sampling: SamplingParams, prior: KPrior | None) -> list[int]:
    req = DecodeRequest(
        PROMPT, sampling, mode="speculative", proposer="draft", k_min=1, k_max=8, k_prior=prior
    )
    return eng.run(req, draft).stats.k_history


@pytest.mark.parametrize(("a", "c"), [(0.95, 0.01), (0.5, 0.05), (0.15, 0.4)])
def test_first_step_uses_the_decisions_k(eng, draft_lm, a: float, c: float) -> None:
    ks = first_k(eng, draft_lm, GREEDY, KPrior(acceptance=a, c=c))
    assert ks[0] == best_k(a, c, 1, 8)[0]


def test_priors_that_differ_start_at_different_k(eng, draft_lm) -> None:
    high = first_k(eng, draft_lm, GREEDY, KPrior(0.95, 0.01))
    low = first_k(eng, draft_lm, GREEDY, KPrior(0.15, 0.4))
    assert high[0] > low[0]  # the check above is not satisfied by one fixed k


def test_without_a_prior_the_default_prior_and_static_c(eng, draft_lm, llama_lm) -> None:
    c = static_c(llama_lm.model.config, draft_lm.model.config)
    assert first_k(eng, draft_lm, GREEDY, None)[0] == best_k(DEFAULT_PRIOR, c, 1, 8)[0]


def test_a_seeded_sampled_request_ignores_the_prior(eng, draft_lm) -> None:
    def run(prior: KPrior | None):
        req = DecodeRequest(
            PROMPT, SEEDED, mode="speculative", proposer="draft", k_min=1, k_max=8, k_prior=prior
        )
        return eng.run(req, draft_lm)

    base, high, low = run(None), run(KPrior(0.95, 0.01)), run(KPrior(0.15, 0.4))
    assert base.stats.k_history == high.stats.k_history == low.stats.k_history
    assert base.token_ids == high.token_ids == low.token_ids


def test_greedy_output_does_not_depend_on_the_prior(eng, draft_lm) -> None:
    runs = [eng.run(DecodeRequest(PROMPT, GREEDY), None)]
    for prior in (None, KPrior(0.95, 0.01), KPrior(0.15, 0.4)):
        req = DecodeRequest(PROMPT, GREEDY, mode="speculative", proposer="draft", k_prior=prior)
        runs.append(eng.run(req, draft_lm))
    assert len({r.token_ids for r in runs}) == 1
