"""Tree speculation (proposers/tree.py, tree_step.py, batch/verify_step.py): greedy token for
token equal to standard decoding alone and in a mixed batch (draft model and head trees
beside standard, chain, lookup, grammar and logprob rows), on the lean decoder and the
model's own forward and on a sliding-window family; a tree mask that lets a node see its
siblings must break that comparison; sampled tree rows go through the tree verifier."""

from __future__ import annotations

import copy

import pytest
import torch

from gateway.engine import DecodeRequest, Engine, SamplingParams, TokenSequencesGrammar, tree_step
from gateway.engine.batch import masks as masks_module
from gateway.engine.batch import tree_choice
from gateway.engine.models import wrap_model
from gateway.speed import wrap_fast
from tests.support.batch import Job, drive, mistral
from tests.support.heads import target_sequences, train_tiny_head
from tests.support.models import build_tokenizer, llama
from tests.support.spies import count_calls

TOKENIZER = build_tokenizer()
VOCAB, EOS = len(TOKENIZER), TOKENIZER.eos_token_id
TREE = (3, 2)
WORDS = ["def add(a, b):", "return a + b", "return None", "for i in"]


def noisy(model, scale: float, seed: int = 0):  # type: ignore[no-untyped-def]
    """A copy of `model` with its weights perturbed: a draft that agrees often, not always."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in out.parameters():
            prm.add_(torch.randn(prm.shape, generator=gen) * scale)
    return out


@pytest.fixture(autouse=True)
def trees_always(request, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every step of a tree row drafts a tree (batch/tree_choice.py would switch to chains
    where they pay better; test_tree_choice.py checks the switch)."""
    if "switching" not in request.node.name:
        monkeypatch.setattr(tree_choice, "pick", lambda *a: True)


@pytest.fixture(scope="module", params=["lean", "eager"])
def eng(request) -> Engine:
    model = llama(VOCAB, EOS, seed=6, init=0.3)
    if request.param == "eager":
        return Engine(wrap_model(model, TOKENIZER))
    return Engine(wrap_fast(model, TOKENIZER))


@pytest.fixture(scope="module")
def draft(eng):  # type: ignore[no-untyped-def]
    return wrap_fast(noisy(eng.target.model, 0.03), TOKENIZER)


@pytest.fixture(scope="module")
def head(eng, tmp_path_factory):  # type: ignore[no-untyped-def]
    return train_tiny_head(eng, tmp_path_factory.mktemp("head") / "h", steps=60)


@pytest.fixture(scope="module")
def prompts(eng) -> list[tuple[int, ...]]:
    seqs = target_sequences(eng, 24, 24)
    return [tuple(seqs[i, :3].tolist()) for i in range(3)] + [(10, 20, 30, 40, 50), (7,)]


def spec(n: int, k: int = 4, tree: tuple[int, ...] = TREE, **kw) -> dict:
    sp = SamplingParams(temperature=kw.pop("temperature", 0.0), max_tokens=n, **kw)
    return {"sampling": sp, "mode": "speculative", "proposer": "draft", "k_min": k,
            "k_max": k, "tree": tree}  # fmt: skip


@pytest.fixture
def side_paths(monkeypatch) -> list[int]:
    """Counts verdicts whose accepted path leaves the main chain (nodes 0, 1, ...)."""
    seen = [0, 0]
    real = tree_step.verify_tree_greedy

    def spy(tokens, parents, argmax):  # type: ignore[no-untyped-def]
        v = real(tokens, parents, argmax)
        seen[0] += 1
        seen[1] += v.path != list(range(len(v.path)))
        return v

    monkeypatch.setattr(tree_step, "verify_tree_greedy", spy)
    return seen


def standard(eng: Engine, req: DecodeRequest, grammar=None):  # type: ignore[no-untyped-def]
    return eng.run(DecodeRequest(req.prompt_ids, req.sampling, grammar=grammar))


@pytest.mark.parametrize("which", ["draft", "head"])
def test_greedy_tree_alone_is_standard_decoding(eng, draft, head, prompts, side_paths,
                                                which) -> None:  # fmt: skip
    d = draft if which == "draft" else head
    accepted = 0
    for p in prompts:
        req = DecodeRequest(p, **spec(24))
        res = eng.run(req, draft=d)
        assert res.token_ids == standard(eng, req).token_ids
        accepted += res.stats.accepted
    assert accepted > 10
    assert side_paths[1] > 0, side_paths  # some steps kept a side branch


def mixed(eng: Engine, draft, head, prompts) -> list[Job]:  # type: ignore[no-untyped-def]
    seqs = [eng.tokenizer(w, add_special_tokens=False)["input_ids"] for w in WORDS]
    g = TokenSequencesGrammar(seqs, True)
    return [
        Job(0, DecodeRequest(prompts[0], **spec(20)), draft),
        Job(0, DecodeRequest(prompts[1], SamplingParams(temperature=0.0, max_tokens=18))),
        Job(1, DecodeRequest(prompts[2], **spec(22)), head),
        Job(1, DecodeRequest(prompts[3], **spec(14, k=3, tree=())), draft),
        Job(2, DecodeRequest(prompts[3], **{**spec(12, tree=()), "proposer": "prompt_lookup"})),
        Job(2, DecodeRequest(prompts[4], **spec(25), grammar=g), draft),
        Job(3, DecodeRequest(prompts[0], **spec(16, logprobs=True, top_logprobs=3)), head),
        Job(4, DecodeRequest(prompts[2], **spec(16, k=6, tree=(2, 2, 2))), draft),
    ]  # fmt: skip


def check_mixed(eng, jobs, got) -> int:  # type: ignore[no-untyped-def]
    """How many rows differ from standard decoding alone (logprobs checked where equal)."""
    seqs = [eng.tokenizer(w, add_special_tokens=False)["input_ids"] for w in WORDS]
    differ = 0
    for job, res in zip(jobs, got, strict=True):
        grammar = None if job.req.grammar is None else TokenSequencesGrammar(seqs, True)
        alone = standard(eng, job.req, grammar)
        if res.token_ids != alone.token_ids:
            differ += 1
            continue
        if job.req.sampling.logprobs:
            assert len(res.logprobs) == len(alone.logprobs)
            for a, b in zip(res.logprobs, alone.logprobs, strict=True):
                assert a.token_id == b.token_id
                assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
                assert [t[0] for t in a.top] == [t[0] for t in b.top]
    return differ


def test_greedy_trees_in_a_mixed_batch_are_standard_decoding(eng, draft, head, prompts,
                                                             side_paths) -> None:  # fmt: skip
    jobs = mixed(eng, draft, head, prompts)
    got = drive(eng.batch(8), eng, jobs)
    assert check_mixed(eng, jobs, got) == 0
    assert side_paths[1] > 0, side_paths
    assert sum(r.stats.accepted for r in got) > 20


def test_rows_switching_between_trees_and_chains_are_standard_decoding(
    eng, draft, head, prompts
) -> None:
    """With the switch on (batch/tree_choice.py: warm-up steps of each mode, then by rate,
    exploring), every row is still standard decoding token for token."""
    jobs = mixed(eng, draft, head, prompts)
    got = drive(eng.batch(8), eng, jobs)
    assert check_mixed(eng, jobs, got) == 0


def sees_siblings(start, parents, keys, width, window, chunk=None):  # type: ignore[no-untyped-def]
    """A broken tree mask: every node sees every node fed before it (a chain's mask)."""
    sees = masks_module.visible(
        torch.arange(start, start + width)[None], keys, window, False, chunk
    )[0, 0]  # (T, S)
    return sees


def test_a_tree_mask_that_shows_siblings_breaks_the_greedy_check(
    eng, draft, head, prompts, monkeypatch
) -> None:
    """Negative control: with each node seeing the nodes fed before it (its siblings and
    their branches), the batch's outputs part from standard decoding."""
    monkeypatch.setattr(masks_module, "tree_visible", sees_siblings)
    jobs = mixed(eng, draft, head, prompts)
    got = drive(eng.batch(8), eng, jobs)
    assert check_mixed(eng, jobs, got) > 0


def test_a_sliding_window_family_verifies_trees_exactly(side_paths) -> None:
    """Mistral with a 16-token window: a tree row's nodes see the committed keys inside the
    window of their own positions (not their write positions)."""
    target = mistral(VOCAB, EOS)
    eng = Engine(wrap_fast(target, TOKENIZER))
    d = wrap_fast(noisy(target, 0.05, seed=1), TOKENIZER)
    prompt = tuple(range(30, 52))  # longer than the window
    for req in [DecodeRequest(prompt, **spec(30)), DecodeRequest(prompt[:5], **spec(30))]:
        assert eng.run(req, draft=d).token_ids == standard(eng, req).token_ids
    jobs = [
        Job(0, DecodeRequest(prompt, **spec(30)), d),
        Job(1, DecodeRequest(prompt[:9], SamplingParams(temperature=0.0, max_tokens=20))),
    ]
    got = drive(eng.batch(4), eng, jobs)
    assert check_mixed(eng, jobs, got) == 0
    assert side_paths[1] > 0


def test_sampled_tree_rows_use_the_tree_verifier(eng, draft, head, prompts, monkeypatch) -> None:
    """A seeded sampled tree row: the tree verifier decides its steps, and its output alone
    and in a batch beside others is the same (its seed alone decides it)."""
    calls = count_calls(monkeypatch, tree_step, "verify_tree_sampled")
    req = DecodeRequest(prompts[0], **spec(20, temperature=0.8, seed=3))
    alone = eng.run(req, draft=draft)
    assert calls[0] > 0
    assert eng.run(req, draft=draft).token_ids == alone.token_ids
    jobs = [
        Job(0, req, draft),
        Job(0, DecodeRequest(prompts[1], **spec(20, temperature=0.8, seed=4)), head),
        Job(1, DecodeRequest(prompts[2], SamplingParams(max_tokens=9))),
    ]
    got = drive(eng.batch(4), eng, jobs)  # fmt: skip
    assert got[0].token_ids == alone.token_ids


@pytest.mark.parametrize(("window", "chunk"), [(None, None), (4, None), (None, 4), (3, 4)])
def test_the_tree_mask_by_hand(window, chunk) -> None:  # type: ignore[no-untyped-def]
    """Root at write position 4 (positions 0-3 committed); nodes 0 and 1 children of the
    root, node 2 of node 0, node 3 of node 2; one padded query. Every (query, key) pair
    against its definition: committed keys and ancestors, window and chunk on positions."""
    start, parents, width = 4, [-1, -1, 0, 2], 6
    sees = masks_module.tree_visible(start, parents, torch.arange(12), width, window, chunk)
    depth = [0, 1, 1, 2, 3]
    ancestors = [{0}, {0, 1}, {0, 2}, {0, 1, 3}, {0, 1, 3, 4}]  # per feed row, itself included
    for j in range(width):
        qpos = start + depth[j] if j <= len(parents) else start - 1
        for key in range(12):
            if key < start:
                kpos, ok = key, True
            elif key <= start + len(parents):
                kpos = start + depth[key - start]
                ok = (key - start) in ancestors[j] if j <= len(parents) else key == start
            else:
                kpos, ok = key, False
            if window is not None and j <= len(parents):
                ok &= kpos > qpos - window
            if window is not None and j > len(parents) and key < start:
                ok &= kpos > qpos - window
            if chunk is not None and (j <= len(parents) or key < start):
                ok &= kpos // chunk == qpos // chunk
            assert bool(sees[j, key]) == ok, (j, key)


def test_a_tree_row_runs_to_the_end_of_its_context(eng, draft, head) -> None:
    """Near the slot's end a tree is cut to the room left (by index): the row still ends
    with "length" on standard decoding's tokens."""
    prompt = tuple(range(40, 120))  # 80 of the 96 positions
    for d in (draft, head):
        req = DecodeRequest(prompt, **spec(40, k=6, tree=(4, 3)))
        res = eng.run(req, draft=d)
        alone = standard(eng, req)
        assert res.token_ids == alone.token_ids and res.finish_reason == alone.finish_reason
        assert res.finish_reason == "length"


def test_a_head_tree_row_gets_the_targets_states_of_its_committed_positions(
    eng, head, prompts, monkeypatch, side_paths
) -> None:
    """The head reads the states of the root and the accepted path (gathered from the tree
    forward's rows), which are those of the committed positions (control: off by one)."""
    from .test_head import collect_features, features_match, reference_features

    seen = collect_features(monkeypatch)
    for i, p in enumerate(prompts[:4]):
        res = eng.run(DecodeRequest(p, **spec(20)), draft=head)
        committed = [*p, *res.token_ids][:-1]
        ref = reference_features(eng, committed, head.model.cfg.taps)
        assert len(seen) == i + 1
        assert features_match(seen[i], ref)
        assert not features_match(seen[i], ref, shift=1)
    assert side_paths[1] > 0  # some accepted paths left the main chain


def test_head_trees_under_a_grammar_are_standard_decoding(eng, head, prompts) -> None:
    """Every branch of a head's tree is drafted under the grammar (its state rolled back to
    each side child's parent), and the grammar row decodes as standard decoding does."""
    seqs = [eng.tokenizer(w, add_special_tokens=False)["input_ids"] for w in WORDS]
    for p in prompts[:3]:
        req = DecodeRequest(p, **spec(25), grammar=TokenSequencesGrammar(seqs, True))
        res = eng.run(req, draft=head)
        alone = standard(eng, req, TokenSequencesGrammar(seqs, True))
        assert res.token_ids == alone.token_ids


def test_a_tree_is_cut_to_max_k_nodes(eng, draft, monkeypatch) -> None:
    """The widest shape the policy allows drafts more than MAX_K nodes: the step feeds at
    most 1 + MAX_K tokens (what a slot's padding holds) and decodes exactly."""
    from gateway.engine.batch import verify_step
    from gateway.limits import MAX_K

    widths: list[int] = []
    real = verify_step.batched_forward

    def spy(model, step, fast=None):  # type: ignore[no-untyped-def]
        widths.append(max(len(x) for x in step.tokens))
        return real(model, step, fast)

    monkeypatch.setattr(verify_step, "batched_forward", spy)
    req = DecodeRequest((10, 20, 30), **spec(20, k=16, tree=(8, 8, 8, 8)))
    assert eng.run(req, draft=draft).token_ids == standard(eng, req).token_ids
    assert max(widths) == 1 + MAX_K
