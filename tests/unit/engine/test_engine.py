"""Engine behaviour: determinism, limits, EOS, stop strings, errors, grammar, streaming,
logprobs, loading."""

from __future__ import annotations

import pytest
import torch

from gateway.engine import (
    DecodeRequest,
    Delta,
    EmptyPrompt,
    Engine,
    EngineError,
    Finished,
    InvalidRequest,
    PromptTooLong,
    SamplingParams,
    TokenSequencesGrammar,
    VocabularyMismatch,
    check_pair,
)
from gateway.engine.sampling import warp
from gateway.speed import load_fast, wrap_fast
from tests.support.models import CONTEXT, build_tokenizer, llama, save

PROMPT = (10, 20, 30, 40, 50)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def eng(llama_lm) -> Engine:
    return Engine(llama_lm)


def spec(prompt=PROMPT, sampling=GREEDY, proposer="draft", **kw) -> DecodeRequest:
    return DecodeRequest(prompt, sampling, mode="speculative", proposer=proposer, **kw)


def collect(stream) -> tuple[list[Delta], Finished]:
    items = list(stream)
    assert isinstance(items[-1], Finished)
    assert all(isinstance(i, Delta) for i in items[:-1])
    return items[:-1], items[-1]


# -- loading and pairing -------------------------------------------------------------------


def test_load_model_describes_the_model(llama_lm, gpt2_lm, tokenizer) -> None:
    for lm in (llama_lm, gpt2_lm):
        assert lm.device == torch.device("cpu")
        assert lm.dtype == torch.float32
        assert lm.vocab_size == len(tokenizer)
        assert lm.context_length == CONTEXT
        assert lm.eos_token_ids == (tokenizer.eos_token_id,)
        assert not lm.model.training


def test_vocab_size_mismatch_is_refused(llama_lm, tmp_path) -> None:
    tok = build_tokenizer(vocab_size=280)
    other = load_fast(save(llama(len(tok), tok.eos_token_id, seed=9), tok, tmp_path / "m"))
    with pytest.raises(VocabularyMismatch, match="vocab sizes differ"):
        check_pair(llama_lm, other)
    with pytest.raises(VocabularyMismatch):
        Engine(llama_lm).run(spec(), draft=other)


def test_token_mismatch_names_the_token(llama_lm, tmp_path) -> None:
    tok = build_tokenizer(special="<end>")  # same size, the special token differs
    other = load_fast(save(llama(len(tok), tok.eos_token_id, seed=9), tok, tmp_path / "m"))
    with pytest.raises(VocabularyMismatch, match=r"token id 0 differs.*'<eos>'.*'<end>'"):
        check_pair(llama_lm, other)


# -- request errors ----------------------------------------------------------------------


def test_empty_prompt(eng) -> None:
    with pytest.raises(EmptyPrompt):
        eng.run(DecodeRequest((), GREEDY))


def test_prompt_too_long(eng) -> None:
    with pytest.raises(PromptTooLong) as info:
        eng.run(DecodeRequest(tuple(range(1, CONTEXT + 1)), GREEDY))
    assert (info.value.prompt_tokens, info.value.context_length) == (CONTEXT, CONTEXT)
    assert isinstance(info.value, EngineError)


@pytest.mark.parametrize(
    ("req", "match"),
    [
        (spec(proposer="draft"), "needs a draft"),
        (spec(proposer="prediction"), "prediction text"),
        (spec(proposer="prompt_lookup", k_min=3, k_max=2), "k_min"),
        (spec(proposer="prompt_lookup", k_min=0), "k_min"),
        (DecodeRequest(PROMPT, SamplingParams(top_p=0.0)), "top_p"),
        (DecodeRequest(PROMPT, SamplingParams(temperature=-1)), "temperature"),
        (DecodeRequest(PROMPT, SamplingParams(top_logprobs=21)), "top_logprobs"),
        (DecodeRequest(PROMPT, SamplingParams(max_tokens=0)), "max_tokens"),
        (DecodeRequest((10**6,), GREEDY), "prompt token ids"),
        (DecodeRequest(PROMPT, GREEDY, min_draft_confidence=1.5), "min_draft_confidence"),
        (
            DecodeRequest(PROMPT, SamplingParams(allowed_token_ids=(3,), banned_token_ids=(3,))),
            "empty",
        ),
    ],
)
def test_invalid_requests(eng, req, match) -> None:
    with pytest.raises(InvalidRequest, match=match):
        eng.run(req)


# -- determinism, limits, EOS, context -----------------------------------------------------


@pytest.mark.parametrize("proposer", [None, "draft", "prompt_lookup"])
def test_same_seed_same_output(eng, draft_lm, proposer) -> None:
    def run(seed: int):
        sp = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=20, seed=seed)
        req = (
            DecodeRequest(PROMPT, sp) if proposer is None else spec(sampling=sp, proposer=proposer)
        )
        return eng.run(req, draft=draft_lm).token_ids

    assert run(1) == run(1)
    assert len({run(s) for s in range(2, 6)}) > 1  # and the seed matters


def test_same_seed_same_output_with_a_confidence_floor(eng, draft_lm) -> None:
    """Where drafting stops depends on the draft's probabilities only, never on timings."""

    def run(seed: int):
        sp = SamplingParams(temperature=1.0, max_tokens=20, seed=seed)
        return eng.run(spec(sampling=sp, min_draft_confidence=0.3), draft=draft_lm).token_ids

    assert run(7) == run(7)


@pytest.mark.parametrize("max_tokens", [1, 2, 3])
def test_max_tokens_smaller_than_k(eng, max_tokens) -> None:
    draft = wrap_fast(eng.target.model, eng.tokenizer)  # a perfect draft: always accepted
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    res = eng.run(spec(sampling=sp, k_min=6, k_max=8), draft=draft)
    assert res.token_ids == eng.run(DecodeRequest(PROMPT, sp)).token_ids
    assert len(res.token_ids) == max_tokens and res.finish_reason == "length"
    assert all(k <= max_tokens - 1 for k in res.stats.k_history)
    assert res.stats.drafted <= max_tokens - 1


def test_stops_at_context_length(eng) -> None:
    prompt = tuple(range(1, CONTEXT - 3))
    sp = SamplingParams(temperature=0.0, max_tokens=50)
    std = eng.run(DecodeRequest(prompt, sp))
    sp_res = eng.run(spec(prompt=prompt, sampling=sp, proposer="prompt_lookup"))
    assert len(std.token_ids) == 4 and std.finish_reason == "length"
    assert sp_res.token_ids == std.token_ids


def eos_bias(eng) -> tuple[float, tuple[int, ...]]:
    """A logit bias on EOS that makes greedy decoding end with EOS after a few tokens."""
    eos = eng.target.eos_token_ids[0]
    for b in torch.linspace(0.0, 8.0, 81).tolist():
        sp = SamplingParams(temperature=0.0, max_tokens=24, logit_bias=((eos, b),))
        out = eng.run(DecodeRequest(PROMPT, sp)).token_ids
        if 4 <= len(out) < 24 and out[-1] == eos:
            return b, out
    raise AssertionError("no bias makes EOS appear")


def test_eos_inside_a_draft(eng) -> None:
    b, expected = eos_bias(eng)
    eos = eng.target.eos_token_ids[0]
    sp = SamplingParams(temperature=0.0, max_tokens=24, logit_bias=((eos, b),))
    # the prediction continues past EOS; the draft model is the target itself
    text = eng.tokenizer.decode(expected[:-1]) + "<eos>" + "def f(x): return x"
    perfect = wrap_fast(eng.target.model, eng.tokenizer)
    for req, draft in (
        (spec(sampling=sp, proposer="prediction", prediction=text, k_min=8, k_max=8), None),
        (spec(sampling=sp, proposer="draft", k_min=8, k_max=8), perfect),
    ):
        res = eng.run(req, draft=draft)
        assert res.token_ids == expected
        assert res.finish_reason == "stop"
        assert eng.tokenizer.decode([eos]) not in res.text
    assert res.stats.accepted > 0


def test_cancellation(eng) -> None:
    calls = iter(range(100))
    items = list(eng.stream(DecodeRequest(PROMPT, GREEDY), cancelled=lambda: next(calls) >= 3))
    res = items[-1].result
    assert res.finish_reason == "cancelled" and len(res.token_ids) == 3


# -- stop strings and streaming ------------------------------------------------------------


def test_stop_strings_match_standard_wherever_they_fall(eng) -> None:
    sp = SamplingParams(temperature=0.0, max_tokens=30)
    full = eng.run(DecodeRequest(PROMPT, sp))
    text = full.text
    cuts = [i for i in range(1, len(text) - 2) if "\ufffd" not in text[i : i + 3]]
    assert len(cuts) >= 5
    for i in cuts[::2]:
        stop = text[i : i + 2]
        expected = text[: text.find(stop)]
        stop_sp = SamplingParams(temperature=0.0, max_tokens=30, stop=(stop, "never-seen"))
        std = eng.run(DecodeRequest(PROMPT, stop_sp))
        assert std.text == expected and std.finish_reason == "stop"
        req = spec(sampling=stop_sp, proposer="prediction", prediction=text, k_min=4, k_max=4)
        deltas, fin = collect(eng.stream(req))
        assert fin.result.token_ids == std.token_ids
        assert fin.result.text == expected
        assert "".join(d.text for d in deltas) == expected
        assert fin.result.stats.num_drafts >= 1


def test_stream_deltas_concatenate_to_result(eng, draft_lm) -> None:
    sp = SamplingParams(temperature=0.8, max_tokens=30, seed=3, logprobs=True, top_logprobs=2)
    for req in (DecodeRequest(PROMPT, sp), spec(sampling=sp)):
        deltas, fin = collect(eng.stream(req, draft=draft_lm))
        res = fin.result
        assert "".join(d.text for d in deltas) == res.text
        assert tuple(t for d in deltas for t in d.token_ids) == res.token_ids
        assert tuple(lp for d in deltas for lp in d.logprobs) == res.logprobs
        assert res.text == eng.tokenizer.decode(res.token_ids, skip_special_tokens=True)


# -- logprobs ------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("proposer", [None, "draft", "prompt_lookup"])
def test_logprobs_match_a_full_forward(eng, draft_lm, temperature, proposer) -> None:
    sp = SamplingParams(
        temperature=temperature, top_k=40, max_tokens=16, seed=5, logprobs=True, top_logprobs=5
    )
    req = DecodeRequest(PROMPT, sp) if proposer is None else spec(sampling=sp, proposer=proposer)
    res = eng.run(req, draft=draft_lm)
    ids = torch.tensor([PROMPT + res.token_ids])
    with torch.no_grad():
        logits = eng.target.model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1]  # (n, V)
    if temperature == 0.0:
        want = torch.log_softmax(logits, -1)
    else:
        want = torch.log(warp(logits, temperature, 1.0, 40))
    assert len(res.logprobs) == len(res.token_ids)
    for j, lp in enumerate(res.logprobs):
        assert lp.token_id == res.token_ids[j]
        assert lp.logprob == pytest.approx(float(want[j, lp.token_id]), abs=1e-4)
        top_vals, top_ids = torch.topk(want[j], 5)
        assert [t[0] for t in lp.top][:1] == top_ids.tolist()[:1]
        assert [t[2] for t in lp.top] == pytest.approx(top_vals.tolist(), abs=1e-4)


# -- grammar -------------------------------------------------------------------------------


def grammar_sequences(tokenizer) -> list[list[int]]:
    words = ["def add(a, b):", "def sub(a, b):", "return a + b", "return None", "for i in"]
    return [tokenizer(w, add_special_tokens=False)["input_ids"] for w in words]


@pytest.mark.parametrize("proposer", ["draft", "prompt_lookup", "prediction"])
def test_grammar_constrained_speculative_equals_standard(eng, draft_lm, proposer) -> None:
    seqs = grammar_sequences(eng.tokenizer)
    sp = SamplingParams(temperature=0.0, max_tokens=40)
    std = eng.run(DecodeRequest(PROMPT, sp, grammar=TokenSequencesGrammar(seqs, repeat=True)))
    res = eng.run(
        spec(
            sampling=sp,
            proposer=proposer,
            grammar=TokenSequencesGrammar(seqs, repeat=True),
            prediction="def add(a, b):return Nonedef sub(a, b):",
        ),
        draft=draft_lm,
    )
    assert res.token_ids == std.token_ids
    check = TokenSequencesGrammar(seqs, repeat=True)
    for t in std.token_ids:
        if t in eng.target.eos_token_ids:
            assert check.is_complete()
        else:
            check.consume(t)  # raises if the output left the grammar


def test_grammar_sampling_stays_inside_and_ends_with_eos(eng, draft_lm) -> None:
    seqs = grammar_sequences(eng.tokenizer)
    eos = eng.target.eos_token_ids[0]
    for seed in range(4):
        sp = SamplingParams(temperature=1.0, max_tokens=40, seed=seed, logit_bias=((eos, 5.0),))
        grammar = TokenSequencesGrammar(seqs)
        res = eng.run(spec(sampling=sp, grammar=grammar), draft=draft_lm)
        assert res.finish_reason == "stop" and res.token_ids[-1] == eos
        assert list(res.token_ids[:-1]) in seqs


def test_allowed_and_banned_lists(eng, draft_lm) -> None:
    allowed = tuple(range(60, 80))
    sp = SamplingParams(
        temperature=1.0, max_tokens=20, seed=1, allowed_token_ids=allowed, banned_token_ids=(61,)
    )
    for req in (DecodeRequest(PROMPT, sp), spec(sampling=sp)):
        res = eng.run(req, draft=draft_lm)
        assert set(res.token_ids) <= set(allowed) - {61}


def test_draft_shaped_like_target_is_always_accepted(eng) -> None:
    """The target drafting for itself: p == q after the same bias / bans / grammar / warping,
    so min(1, p/q) == 1 everywhere (up to rounding). Catches a draft shaped differently."""
    perfect = wrap_fast(eng.target.model, eng.tokenizer)
    seqs = grammar_sequences(eng.tokenizer)
    eos = eng.target.eos_token_ids[0]
    sp = SamplingParams(
        temperature=0.8,
        top_p=0.9,
        top_k=30,
        max_tokens=40,
        seed=11,
        logit_bias=((eos, -3.0), (seqs[0][0], 2.0)),
        banned_token_ids=(seqs[1][0],),
    )
    for grammar in (None, TokenSequencesGrammar(seqs, repeat=True)):
        res = eng.run(spec(sampling=sp, k_min=4, k_max=4, grammar=grammar), draft=perfect)
        assert res.stats.drafted >= 20
        assert res.stats.accepted >= 0.97 * res.stats.drafted
        assert seqs[1][0] not in res.token_ids


def test_stats_times_add_up_to_the_request(eng, draft_lm) -> None:
    import time

    t0 = time.perf_counter()
    res = eng.run(spec(sampling=SamplingParams(temperature=0.0, max_tokens=20)), draft=draft_lm)
    wall = time.perf_counter() - t0
    s = res.stats
    total = s.draft_s + s.verify_s + s.other_s
    assert 0.8 * wall <= total <= wall
    assert s.prefill_s <= s.other_s
    assert s.draft_forwards >= s.drafted and 1 + len(s.k_history) <= s.target_forwards <= 21
    assert s.c is not None and s.c > 0
