"""Suffix decoding (proposers/suffix.py, serving/suffix_store.py): what it matches and
proposes, that it never changes greedy output (alone and inside a mixed batch), that it
really drafts accepted tokens on repeated text, that a tenant's index never drafts another
tenant's text, and that an index stays within its token budget."""

from __future__ import annotations

import threading

import pytest

from gateway.engine import DecodeRequest, DecodeResult, Engine, SamplingParams
from gateway.engine.loop import decode
from gateway.engine.proposers.suffix import SuffixIndex, SuffixParams, SuffixProposer
from gateway.engine.schema import Finished
from gateway.serving.suffix_store import SuffixStore, TenantSuffix
from tests.support.batch import PROMPTS, Job, greedy, mixed_jobs, run_batch

SPEC = {"mode": "speculative", "proposer": "suffix", "k_min": 1, "k_max": 6}
LOOP = (40, 41, 42, 43, 44, 45, 46, 47)


def run_with_proposer(engine: Engine, req: DecodeRequest) -> tuple[DecodeResult, SuffixProposer]:
    """Decode alone through the loop, keeping the proposer to look at what it did."""
    cfg = engine.prepare(req)
    items = list(decode(cfg, None))
    assert isinstance(items[-1], Finished)
    assert isinstance(cfg.proposer, SuffixProposer)
    return items[-1].result, cfg.proposer


class Source:
    """A SuffixSource over a fixed index; counts how often the engine asked for it."""

    def __init__(self, index: SuffixIndex) -> None:
        self._index = index
        self.asked = 0

    def index(self) -> SuffixIndex:
        self.asked += 1
        return self._index


# -- the index ---------------------------------------------------------------------------


def test_longest_match_and_most_frequent_continuation() -> None:
    idx = SuffixIndex()
    idx.add([1, 2, 3, 4, 5, 6])
    idx.add([1, 2, 3, 4, 7, 8])
    idx.add([9, 9, 3, 4, 5, 6])
    # "2 3 4" matches twice (length 3): 5 and 7 tie 1:1, the latest (7) wins; prob 1/2
    s = idx.speculate([0, 2, 3, 4], 8)
    assert (s.match, s.tokens[0]) == (3, 7)
    # "3 4" alone matches three times: 5 follows twice, 7 once
    s = idx.speculate([0, 3, 4], 8)
    assert s.match == 2 and s.tokens == (5, 6)
    assert s.score == pytest.approx(2 / 3 + 2 / 3)
    # the draft length follows the match length (factor 1) and k
    assert idx.speculate([0, 3, 4], 1).tokens == (5,)
    assert idx.speculate([42], 4).tokens == ()  # no match: nothing proposed


def test_min_prob_stops_an_uncertain_walk() -> None:
    idx = SuffixIndex(params=SuffixParams(min_prob=0.5))
    for tail in ([10], [11], [12]):
        idx.add([1, 2, 3, *tail])
    assert idx.speculate([1, 2, 3], 4).tokens == ()  # each next token has 1/3 < 0.5
    idx.add([1, 2, 3, 12])
    assert idx.speculate([1, 2, 3], 4).tokens == (12,)  # 2 of 4 = 0.5


def test_no_match_crosses_from_one_sequence_into_the_next() -> None:
    idx = SuffixIndex()
    idx.add([1, 2])
    idx.add([3, 4])
    assert idx.speculate([1, 2], 4).tokens == ()  # 2 ends its sequence: 3 never follows


def test_the_budget_bounds_memory_and_evicts_the_oldest_first() -> None:
    budget = 50
    idx = SuffixIndex(budget)
    for n in range(40):  # 40 sequences of 7 tokens: 280 tokens through a 50-token index
        idx.add([1000 + n, 1, 2, 3, 4, 5, 2000 + n])
        assert idx.tokens <= budget
        assert idx.entries <= 2 * idx.tokens
    assert idx.sequences == budget // 7
    # the newest sequences are still proposed, the evicted ones never again
    assert idx.speculate([1039, 1, 2], 3).tokens == (3, 4, 5)
    assert idx.speculate([5], 1).tokens == (2039,)  # the latest of the kept ones
    assert idx.speculate([1000], 2).tokens == ()
    assert idx.speculate([1030], 2).tokens == ()  # the oldest evicted so far
    # a sequence longer than the budget keeps its tail
    idx.add(list(range(3000, 3100)))
    assert idx.tokens == budget and idx.sequences == 1
    assert idx.speculate([3059, 3060], 2).tokens == (3061, 3062)
    assert idx.speculate([3010], 2).tokens == ()


def test_pending_sequences_are_bounded_and_taken_in_on_the_decoding_thread() -> None:
    src = TenantSuffix(budget_tokens=30)
    threads = [
        threading.Thread(target=src.record, args=([500 + t, 1, 2, 3, 4, 5, 6, 7, 8, 9],))
        for t in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert src.pending_tokens <= 30
    idx = src.index()  # the decoding thread takes the pending sequences in
    assert src.pending_tokens == 0
    assert 0 < idx.tokens <= 30 and idx.speculate([1, 2, 3], 3).tokens == (4, 5, 6)


# -- exactness and effect on a model -------------------------------------------------------


def test_greedy_output_equals_standard_and_repeated_text_is_accepted(llama_lm) -> None:
    engine = Engine(llama_lm)
    for prompt in [*PROMPTS, LOOP]:
        standard = engine.run(DecodeRequest(prompt, greedy(24)))
        alone, _ = run_with_proposer(engine, DecodeRequest(prompt, greedy(24), **SPEC))
        assert alone.token_ids == standard.token_ids
        # the same request again, with its first answer in the shared index
        shared = SuffixIndex(1000)
        shared.add((*prompt, *standard.token_ids))
        req = DecodeRequest(prompt, greedy(24), suffix_source=Source(shared), **SPEC)
        again, proposer = run_with_proposer(engine, req)
        assert again.token_ids == standard.token_ids
        # it proposed from the shared index, and the target kept most of it
        assert proposer.from_shared > 0
        assert again.stats.accepted >= len(standard.token_ids) // 2, again.stats
        assert again.stats.target_forwards < standard.stats.target_forwards


def test_a_mixed_batch_gives_suffix_rows_their_alone_output(llama_lm, draft_lm) -> None:
    engine = Engine(llama_lm)
    first = engine.run(DecodeRequest(PROMPTS[2], greedy(20)))
    shared = SuffixIndex(1000)
    shared.add((*PROMPTS[2], *first.token_ids))

    def jobs() -> list[Job]:
        src = Source(shared)
        return [
            *mixed_jobs(engine, draft_lm),
            Job(0, DecodeRequest(PROMPTS[2], greedy(20), suffix_source=src, **SPEC)),
            Job(2, DecodeRequest(PROMPTS[0], greedy(16), **SPEC)),
            Job(4, DecodeRequest(LOOP, greedy(18), suffix_source=src, **SPEC)),
        ]

    solo = [engine.run(j.req, j.draft) for j in jobs()]
    batched = run_batch(engine, jobs())
    for j, (a, b) in enumerate(zip(solo, batched, strict=True)):
        assert b.token_ids == a.token_ids, f"row {j} differs in the batch"
    suffix_rows = batched[-3:]
    assert suffix_rows[0].token_ids == first.token_ids
    assert suffix_rows[0].stats.accepted >= len(first.token_ids) // 2  # drafted in the batch


def test_seeded_sampled_requests_draft_from_their_own_text_only(llama_lm) -> None:
    engine = Engine(llama_lm)
    src = Source(SuffixIndex(100))
    sampled = SamplingParams(temperature=0.8, max_tokens=8, seed=7)
    engine.run(DecodeRequest(PROMPTS[0], sampled, suffix_source=src, **SPEC))
    assert src.asked == 0  # its seed alone decides its output
    engine.run(DecodeRequest(PROMPTS[0], greedy(8), suffix_source=src, **SPEC))
    assert src.asked == 1


# -- isolation between tenants -----------------------------------------------------------


def drafts_from_shared(engine: Engine, store: SuffixStore, tenant: str, prompt) -> int:
    req = DecodeRequest(prompt, greedy(24), suffix_source=store.source(tenant, "m"), **SPEC)
    _, proposer = run_with_proposer(engine, req)
    return proposer.from_shared


def test_a_tenant_never_gets_drafts_from_another_tenants_text(llama_lm) -> None:
    engine = Engine(llama_lm)
    prompt = PROMPTS[2]
    secret = engine.run(DecodeRequest(prompt, greedy(24))).token_ids
    store = SuffixStore(budget_tokens=1000)
    store.record("a", "m", prompt, secret)  # only tenant a sent the text
    assert drafts_from_shared(engine, store, "a", prompt) > 0  # a's own index serves it
    assert drafts_from_shared(engine, store, "b", prompt) == 0
    assert store.source("b", "m").index().tokens == 0
    assert store.source("a", "other-model").index().tokens == 0  # per target too


def test_negative_control_a_shared_index_fails_the_isolation_check(llama_lm) -> None:
    """The same check against one index for everybody (what the store must not be): the
    second tenant gets the first tenant's text as drafts, so the check above can fail."""

    class OneForAll(SuffixStore):
        def source(self, tenant: str, model: str) -> TenantSuffix:
            return super().source("everybody", model)

    engine = Engine(llama_lm)
    prompt = PROMPTS[2]
    secret = engine.run(DecodeRequest(prompt, greedy(24))).token_ids
    store = OneForAll(budget_tokens=1000)
    store.record("a", "m", prompt, secret)
    assert drafts_from_shared(engine, store, "b", prompt) > 0


@pytest.mark.parametrize("bad", [0, -5])
def test_a_budget_below_one_token_is_refused(bad: int) -> None:
    with pytest.raises(ValueError):
        SuffixStore(bad)
    with pytest.raises(ValueError):
        SuffixIndex(bad)
