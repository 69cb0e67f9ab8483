"""The feature-conditioned draft head (proposers/head.py): it reads the target's hidden
states of exactly the committed positions, and speculative decoding with it is exact:
greedy token for token alone and in a mixed continuous batch (grammar and logprobs
included), sampled by the chi-square test of test_draft_head.py, each with a negative
control that breaks what the test guards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gateway.engine import DecodeRequest, Engine, SamplingParams, TokenSequencesGrammar
from gateway.engine import loop as loop_module
from gateway.engine.proposers.head import HeadProposer, is_head, load_head_model
from gateway.engine.verifier import Verdict
from gateway.feature_head import VOCAB_FILE
from gateway.speed import wrap_fast
from tests.support.batch import Job, drive
from tests.support.heads import target_sequences, train_tiny_head
from tests.support.models import llama

from .test_draft_head import (
    EOS,
    PROMPT,
    SAMPLES,
    TOKENIZER,
    TOP_K,
    VOCAB,
    chi_square_vs_target,
    first_token_counts,
    residual_from_p,
)  # fmt: skip


@pytest.fixture(scope="module")
def eng() -> Engine:
    return Engine(wrap_fast(llama(VOCAB, EOS, seed=6, init=0.3), TOKENIZER))


@pytest.fixture(scope="module")
def head(eng, tmp_path_factory):
    return train_tiny_head(eng, tmp_path_factory.mktemp("head") / "h")


@pytest.fixture(scope="module")
def prompts(eng) -> list[tuple[int, ...]]:
    """Prompts whose continuations the head was trained on, and one it never saw."""
    seqs = target_sequences(eng, 24, 24)
    return [tuple(seqs[i, :3].tolist()) for i in range(4)] + [(10, 20, 30, 40, 50)]


def spec(n: int, k: int = 4, **kw) -> dict:
    sp = SamplingParams(temperature=0.0, max_tokens=n, **kw)
    return {"sampling": sp, "mode": "speculative", "proposer": "draft", "k_min": k, "k_max": k}


def test_a_head_directory_loads_as_a_draft(head) -> None:
    assert is_head(head)
    assert head.model.cfg.taps == (1, 2)  # a 2-layer target: after layers 1 and 2


def test_greedy_output_is_standard_decoding_token_for_token(eng, head, prompts) -> None:
    accepted = 0
    for p in prompts:
        standard = eng.run(DecodeRequest(p, SamplingParams(temperature=0.0, max_tokens=20)))
        res = eng.run(DecodeRequest(p, **spec(20)), draft=head)
        assert res.token_ids == standard.token_ids
        assert res.stats.drafted > 0
        accepted += res.stats.accepted
    assert accepted > 20  # the head learned its prompts' continuations: it does draft well


def test_a_verifier_that_accepts_every_draft_breaks_the_greedy_check(
    eng, head, prompts, monkeypatch
) -> None:
    """Negative control: accepting the head's tokens unverified changes the output."""
    monkeypatch.setattr(loop_module, "verify_greedy", lambda d, t: Verdict(len(d), t[len(d)]))
    differ = 0
    for p in prompts:
        standard = eng.run(DecodeRequest(p, SamplingParams(temperature=0.0, max_tokens=20)))
        differ += eng.run(DecodeRequest(p, **spec(20)), draft=head).token_ids != standard.token_ids
    assert differ > 0


def collect_features(monkeypatch) -> list[dict[int, torch.Tensor]]:
    """Per HeadProposer, the features it was handed, by position (the last handing wins)."""
    seen: list[dict[int, torch.Tensor]] = []
    original = HeadProposer.on_features

    def on_features(self, start, feats):
        if not hasattr(self, "_spy"):
            self._spy = {}
            seen.append(self._spy)
        for j in range(feats.shape[0]):
            self._spy[start + j] = feats[j].clone()
        original(self, start, feats)

    monkeypatch.setattr(HeadProposer, "on_features", on_features)
    return seen


def reference_features(eng: Engine, ids: list[int], taps: tuple[int, ...]) -> torch.Tensor:
    with torch.inference_mode():
        res = eng.target.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([res.hidden_states[i][0] for i in taps], dim=-1)  # (t, taps H)


def features_match(got: dict[int, torch.Tensor], ref: torch.Tensor, shift: int = 0) -> bool:
    """Whether the handed features of positions 0..len(ref)-1 equal the reference's (the
    reference read `shift` positions on: the negative control's misalignment)."""
    n = ref.shape[0]
    if sorted(got) != list(range(n)):
        return False
    ref = ref[shift:] if shift else ref
    return all(torch.allclose(got[j], ref[j], atol=1e-4) for j in range(min(n, ref.shape[0])))


@pytest.mark.parametrize("batched", [False, True])
def test_the_head_gets_the_targets_states_of_the_committed_positions(
    eng, head, prompts, monkeypatch, batched
) -> None:
    seen = collect_features(monkeypatch)
    p = prompts[1]
    if batched:
        batch = eng.batch(4)
        jobs = [Job(0, DecodeRequest(p, **spec(16)), head), Job(0, DecodeRequest(prompts[0],
                SamplingParams(temperature=0.0, max_tokens=9)))]  # fmt: skip
        res = drive(batch, eng, jobs)[0]
    else:
        res = eng.run(DecodeRequest(p, **spec(16)), draft=head)
    assert res.stats.accepted > 0 and res.stats.accepted < res.stats.drafted + 16
    committed = [*p, *res.token_ids][:-1]  # every committed token but the last was fed
    ref = reference_features(eng, committed, head.model.cfg.taps)
    assert len(seen) == 1
    assert features_match(seen[0], ref)
    assert not features_match(seen[0], ref, shift=1)  # the check sees an off-by-one


def test_greedy_in_a_mixed_batch_is_standard_decoding(eng, head, prompts) -> None:
    words = ["def add(a, b):", "return a + b", "return None", "for i in"]
    seqs = [eng.tokenizer(w, add_special_tokens=False)["input_ids"] for w in words]
    greedy = SamplingParams(temperature=0.0, max_tokens=18)
    jobs = [
        Job(0, DecodeRequest(prompts[0], **spec(20)), head),
        Job(0, DecodeRequest(prompts[1], greedy)),
        Job(1, DecodeRequest(prompts[2], **spec(14, k=2)), head),
        Job(1, DecodeRequest(prompts[3], **{**spec(12), "proposer": "prompt_lookup"})),
        Job(2, DecodeRequest(prompts[4], **spec(25), grammar=TokenSequencesGrammar(seqs, True)),
            head),
        Job(4, DecodeRequest(prompts[3], **spec(16, logprobs=True, top_logprobs=3)), head),
    ]  # fmt: skip
    got = drive(eng.batch(8), eng, jobs)
    for job, res in zip(jobs, got, strict=True):
        sp = job.req.sampling
        grammar = None if job.req.grammar is None else TokenSequencesGrammar(seqs, True)
        alone = eng.run(DecodeRequest(job.req.prompt_ids, sp, grammar=grammar))
        assert res.token_ids == alone.token_ids
        if sp.logprobs:
            assert len(res.logprobs) == len(alone.logprobs)
            for a, b in zip(res.logprobs, alone.logprobs, strict=True):
                assert a.token_id == b.token_id
                assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
    assert sum(r.stats.accepted for r, j in zip(got, jobs, strict=True) if j.draft) > 0


@pytest.fixture(scope="module")
def restricted_head(eng, head):
    """The head drafting among half of the target's top-k tokens at PROMPT, through a
    reduced vocabulary (draft_vocab.json), as test_draft_head.py's
    sampled draft: both acceptance and the residual carry mass."""
    with torch.inference_mode():
        top = torch.topk(eng.target.model(input_ids=torch.tensor([PROMPT])).logits[0, -1], TOP_K)
    keep = top.indices[::2].tolist()
    path = Path(head.path)
    (path / VOCAB_FILE).write_text(json.dumps({"token_ids": keep}))
    try:
        return load_head_model(str(path), eng.target)
    finally:
        (path / VOCAB_FILE).unlink()


def test_sampled_output_has_the_target_distribution(eng, restricted_head) -> None:
    assert restricted_head.model.out_ids is not None
    counts, drafted = first_token_counts(eng, restricted_head)
    assert drafted > SAMPLES // 2  # the head did propose
    stat, critical = chi_square_vs_target(eng, counts)
    assert stat < critical, (stat, critical)


def test_the_chi_square_test_catches_a_wrong_residual_with_the_head(
    eng, restricted_head, monkeypatch
) -> None:
    """Negative control: on rejection, sample from p instead of max(0, p - q)."""
    monkeypatch.setattr(loop_module, "verify_sampled", residual_from_p)
    counts, _ = first_token_counts(eng, restricted_head)
    stat, critical = chi_square_vs_target(eng, counts)
    assert stat > critical, (stat, critical)


def test_a_head_row_inside_a_batch_samples_the_target_distribution(eng, restricted_head) -> None:
    """test_batch_sampled.py's batched test (its control fails it) with the head drafting."""
    from .test_batch_sampled import batched_first_token_counts

    counts, drafted, shared = batched_first_token_counts(eng, restricted_head)
    assert drafted > SAMPLES // 2 and shared == SAMPLES  # drafted, and in company
    stat, critical = chi_square_vs_target(eng, counts)
    assert stat < critical, (stat, critical)
