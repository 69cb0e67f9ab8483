"""Load-aware speculation inside a batch: measured forward costs (batch/costs.py) and the
one k per step the batch picks from them (batch/kchoice.py)."""

from __future__ import annotations

import itertools
import time

import pytest

from gateway.engine import DecodeRequest, Engine, SamplingParams
from gateway.engine.batch.costs import ForwardCosts, probe, row_bucket
from gateway.engine.batch.kchoice import EXPLORE_EVERY, choose_batch_k, explore_offset
from tests.support.batch import PROMPTS, Job, greedy, run_batch


def table(per_token: dict[int, float]) -> ForwardCosts:
    """Seconds T(B, t) = 1 + per_token[B] * (t - 1) for buckets B (a steep CPU-like growth
    for a large per_token, a flat GPU-like one for 0)."""
    costs = ForwardCosts()
    for b, slope in per_token.items():
        for t in (1, 2, 3, 5, 9):
            costs.means[(b, t)] = 1.0 + slope * (t - 1)
    return costs


def spec(engine: Engine, draft, seed: int | None = None, may_pause: bool = True, k=(1, 6)):
    sp = SamplingParams(temperature=0.0 if seed is None else 0.8, max_tokens=16, seed=seed)
    req = DecodeRequest(PROMPTS[0], sp, mode="speculative", proposer="draft",
                        k_min=k[0], k_max=k[1], may_pause=may_pause)  # fmt: skip
    return engine.prepare(req, draft)


def test_interpolation_and_buckets() -> None:
    costs = table({1: 0.5})
    assert row_bucket(1) == 1 and row_bucket(5) == 8 and row_bucket(8) == 8
    assert costs.seconds(1, 4) == pytest.approx(2.5)  # between the probed 3 and 5
    assert costs.seconds(1, 17) == pytest.approx(9.0)  # past the last: the last slope
    assert costs.seconds(8, 1) == pytest.approx(1.0)  # no bucket 8: the nearest smaller one
    assert ForwardCosts().seconds(1, 1) is None
    assert costs.verify_costs(1, 2) == pytest.approx((1.0, 1.5, 2.0))


def test_a_spike_in_the_measurements_never_makes_fewer_tokens_cost_more() -> None:
    """Seen on this CPU: a probe timed 2-token forwards at 3.2x 1-token ones and 3-token
    ones at 1.0x. The curve reads as non-decreasing, so k = 1 is not priced out."""
    costs = ForwardCosts({(1, 1): 1.0, (1, 2): 3.2, (1, 3): 1.0, (1, 5): 1.2, (1, 9): 1.8})
    assert costs.seconds(1, 2) == pytest.approx(1.0)  # at most what 3 tokens cost
    curve = [costs.seconds(1, t) for t in range(1, 12)]
    assert all(a <= b for a, b in itertools.pairwise(curve))
    assert costs.verify_costs(1, 2) == pytest.approx((1.0, 1.0, 1.0))
    assert costs.seconds(1, 9) == pytest.approx(1.8)  # the largest shape keeps its own


def test_observe_follows_the_measurements() -> None:
    costs = ForwardCosts()
    costs.observe(3, 2, 1.0)
    costs.observe(4, 2, 2.0)  # the same bucket (4): an exponentially weighted mean
    assert costs.means == {(4, 2): pytest.approx(1.2)}


def test_speculation_pays_on_flat_costs_and_pauses_on_steep_ones(llama_lm, draft_lm) -> None:
    engine = Engine(llama_lm)
    rows = [spec(engine, draft_lm) for _ in range(4)]
    drafts = {id(draft_lm): (draft_lm, table({4: 0.0}))}
    drafts[id(draft_lm)][1].means = {(4, 1): 0.05}  # a draft forward: 5% of a target one
    assert choose_batch_k(rows, table({4: 0.0}), drafts) > 0  # verify is free: draft ahead
    assert all(r.policy.batch_k == rows[0].policy.batch_k for r in rows)
    assert choose_batch_k(rows, table({4: 2.0}), drafts) == 0  # each token costs 2 steps
    assert all(r.policy.choose() == 0 for r in rows)


def test_forced_rows_keep_k_min_and_seeded_rows_their_own_k(llama_lm, draft_lm) -> None:
    engine = Engine(llama_lm)
    forced = spec(engine, draft_lm, may_pause=False, k=(2, 6))
    seeded = spec(engine, draft_lm, seed=7)
    own = seeded.policy.choose()
    assert choose_batch_k([forced, seeded], table({2: 2.0}), {}) == 0
    assert forced.policy.choose() == 2  # clamped to its k_min: forced speculation stays on
    assert seeded.policy.batch_k is None and seeded.policy.choose() == own


def test_no_choice_without_measured_costs(llama_lm, draft_lm) -> None:
    engine = Engine(llama_lm)
    rows = [spec(engine, draft_lm)]
    assert choose_batch_k(rows, None, {}) is None
    one_point = ForwardCosts({(1, 1): 1.0})
    assert choose_batch_k(rows, one_point, {}) is None
    assert rows[0].policy.batch_k is None


def test_speculation_turns_off_at_a_big_batch_and_back_on_when_it_shrinks(
    llama_lm, draft_lm
) -> None:
    engine = Engine(llama_lm)
    costs = table({1: 0.0, 8: 3.0})  # flat alone, steep at 8 rows
    drafts = {id(draft_lm): (draft_lm, ForwardCosts({(1, 1): 0.05, (8, 1): 0.05}))}
    crowd = [spec(engine, draft_lm) for _ in range(8)]
    assert choose_batch_k(crowd, costs, drafts) == 0
    assert choose_batch_k(crowd[:1], costs, drafts) > 0


def test_a_paused_row_gives_its_alone_output(llama_lm, draft_lm) -> None:
    """Rows that may pause, in a batch whose measured costs say speculation does not pay:
    they draft nothing on those steps and still give their alone output."""
    engine = Engine(llama_lm)
    engine.costs[id(llama_lm)] = table({1: 5.0, 2: 5.0, 4: 5.0, 8: 5.0})
    req = {"mode": "speculative", "proposer": "draft", "k_min": 1, "k_max": 4}
    jobs = [Job(0, DecodeRequest(p, greedy(14), may_pause=True, **req), draft_lm) for p in PROMPTS]
    solo = [engine.run(j.req, j.draft) for j in jobs]
    got = run_batch(engine, jobs)
    for a, b in zip(solo, got, strict=True):
        assert b.token_ids == a.token_ids
        assert b.stats.paused_steps > 0 and b.stats.mean_batch_rows > 1


def test_probe_measures_every_bucket(llama_lm) -> None:
    costs = probe(llama_lm, 3, tokens=(1, 2), context=8, repeats=1)
    assert set(costs.means) == {(b, t) for b in (1, 2, 4) for t in (1, 2)}
    assert all(s > 0 for s in costs.means.values())


def test_now_and_then_a_step_runs_a_neighbouring_k_so_a_noisy_probe_is_corrected(
    llama_lm, draft_lm
) -> None:
    """A probe that timed the best k's forwards too high (a spike is read at most as high
    as the next larger shape) moves the choice to a neighbour, and only running that k
    measures it again. Every EXPLORE_EVERY-th step runs the best k + 1, then - 1, within
    0..k_max, and the observed cost replaces the bad estimate."""
    offsets = [explore_offset(s) for s in range(4 * EXPLORE_EVERY)]
    assert offsets.count(0) == 4 * (EXPLORE_EVERY - 1)
    assert [o for o in offsets if o] == [1, -1, 1, -1]
    engine = Engine(llama_lm)
    row = spec(engine, draft_lm, k=(1, 6))
    drafts = {id(draft_lm): (draft_lm, ForwardCosts({(1, 1): 0.01}))}
    clean = choose_batch_k([row], table({1: 0.1}), drafts)
    assert clean is not None and clean > 1
    costs = ForwardCosts({(1, t): 1.0 + 0.1 * (t - 1) for t in range(1, 10)})  # all observed
    assert choose_batch_k([row], costs, drafts) == clean
    costs.means[(1, 1 + clean)] = 10.0  # the noisy probe of the best k's forward
    best = choose_batch_k([row], costs, drafts)
    assert best is not None and abs(best - clean) == 1  # a neighbour: exploring reaches it
    offset = clean - best
    assert choose_batch_k([row], costs, drafts, explore=offset) == clean
    assert row.policy.batch_k == clean  # what the rows run on that step
    assert choose_batch_k([row], costs, drafts, explore=-offset) == best - offset
    for _ in range(30):  # the real cost of the shape, observed whenever a step runs it
        costs.observe(1, 1 + clean, 1.0 + 0.1 * clean)
    assert choose_batch_k([row], costs, drafts) == clean


def test_a_steps_overhead_counts_in_every_step_cost(llama_lm, draft_lm) -> None:
    """What a step spends outside its forwards is paid once a step, so it favours steps
    that emit more tokens: with a forward token costing a whole step, speculation loses
    on forwards alone and wins once each step also costs two forwards of overhead."""
    engine = Engine(llama_lm)
    rows = [spec(engine, draft_lm) for _ in range(4)]
    drafts = {id(draft_lm): (draft_lm, ForwardCosts({(4, 1): 0.05}))}
    costs = table({4: 1.0})
    assert choose_batch_k(rows, costs, drafts) == 0
    costs.observe_overhead(4, False, 2.0)
    costs.observe_overhead(4, True, 2.0)
    assert choose_batch_k(rows, costs, drafts) > 0
    # a drafting step's own overhead is what a drafting step pays
    costs.overheads[(4, True)] = 9.6
    assert choose_batch_k(rows, costs, drafts) == 0


def test_overhead_is_read_at_the_bucket_and_joins_the_verify_costs() -> None:
    costs = table({1: 0.5, 4: 0.5})
    assert costs.overhead(4, True) == 0.0  # nothing measured: the forwards alone
    assert costs.verify_costs(1, 2) == pytest.approx((1.0, 1.5, 2.0))
    costs.observe_overhead(1, False, 1.0)
    costs.observe_overhead(1, True, 1.5)
    costs.observe_overhead(1, True, 1.5 - 5.0)  # a negative sample counts as none
    assert costs.overheads[(1, True)] == pytest.approx(1.2)
    costs.observe_overhead(1, False, 1.0)
    costs.observe_overhead(1, False, 30.0)  # an admin call between two steps: capped at 4x
    assert costs.overheads[(1, False)] == pytest.approx(0.8 * 1.0 + 0.2 * 4.0)
    costs.overheads[(1, False)] = 1.0  # back to 1.0 for what follows
    assert costs.overhead(1, True) == pytest.approx(1.2)
    assert costs.overhead(4, False) == pytest.approx(1.0)  # the nearest smaller bucket
    costs.observe_overhead(3, True, 3.0)
    assert costs.overhead(4, False) == pytest.approx(3.0)  # its bucket, the other kind
    assert costs.overhead(2, False) == pytest.approx(1.0)
    assert costs.standard_step(1) == pytest.approx(2.0)  # T(1, 1) + overhead
    # v(k): (T(1, k + 1) + a drafting step's overhead) / a standard step
    assert costs.verify_costs(1, 2) == pytest.approx((1.0, 1.35, 1.6))


def test_the_draft_cost_ratio_is_taken_against_a_whole_standard_step(llama_lm, draft_lm):
    engine = Engine(llama_lm)
    engine.costs[id(llama_lm)] = table({1: 0.5})
    engine.costs[id(draft_lm)] = ForwardCosts({(1, 1): 0.2})
    assert engine.cost_at(1, 2, draft_lm).draft_c == pytest.approx(0.2)
    engine.costs[id(llama_lm)].observe_overhead(1, False, 1.0)
    cost = engine.cost_at(1, 2, draft_lm)
    assert cost.draft_c == pytest.approx(0.1)
    # (1.5 + 1) / 2 and (2 + 1) / 2: a drafting step's overhead, unmeasured, is a standard one's
    assert cost.verify == pytest.approx((1.0, 1.25, 1.5))


def test_a_batch_measures_its_steps_outside_the_forwards(llama_lm, draft_lm) -> None:
    """The time from one decoding step to the next, less the forwards, is observed by row
    bucket and by whether the step drafted; a step that prefilled is not observed."""
    engine = Engine(llama_lm)
    batch = engine.batch(4)
    sp = greedy(12)
    batch.add(engine.prepare(DecodeRequest(PROMPTS[0], sp)))
    batch.add(
        engine.prepare(
            DecodeRequest(PROMPTS[2], sp, mode="speculative", proposer="draft", k_min=2, k_max=2),
            draft_lm,
        )
    )
    costs = engine.costs.setdefault(id(llama_lm), ForwardCosts())
    while any(r.prefilling for r in batch.rows):
        batch.step()  # prefills (in chunks of the shorter prompt's length): not observed
        time.sleep(0.05)
    batch.step()
    assert costs.overheads == {}
    time.sleep(0.05)  # after a decoding step in which a row drafted
    batch.step()
    assert set(costs.overheads) == {(2, True)}
    assert 0.05 <= costs.overheads[(2, True)] < 0.05 + 0.5  # the sleep, not the forwards
    while batch.rows:
        batch.step()
    time.sleep(0.05)  # the batch ran empty: the next arrival's first step starts afresh
    batch.add(engine.prepare(DecodeRequest(PROMPTS[1], sp)))
    before = dict(costs.overheads)
    batch.step()
    assert costs.overheads == before
