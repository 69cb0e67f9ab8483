"""JSON-schema constraints inside the engine: speculative greedy output equals standard greedy
output token for token, every output that stops is valid JSON under its schema, and one
speculative step under a grammar mask emits exactly the masked, renormalised target
distribution (by enumeration and with the real verify_sampled)."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from gateway.engine import DecodeRequest, DecodeResult, Engine, SamplingParams
from gateway.engine.constraints.base import next_token_mask
from gateway.engine.constraints.json_schema import compile_json_grammar, validate_output
from gateway.engine.sampling import LogitsShaper
from gateway.engine.verifier import acceptance_probability, residual, verify_sampled

SCHEMAS: dict[str, dict | None] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "xs": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 99},
                "minItems": 1,
                "maxItems": 5,
            }
        },
        "required": ["xs"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "p": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -5, "maximum": 5},
                    "tag": {"type": "string", "maxLength": 3},
                    "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
                },
                "required": ["x", "tag", "flags"],
                "additionalProperties": False,
            }
        },
        "required": ["p"],
        "additionalProperties": False,
    },
    "optional": {
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"type": "boolean"}},
        "additionalProperties": False,
    },
    "json_object": None,
}
PROMPTS = [(10, 20, 30, 40, 50), (5, 6, 7), (91, 2, 65, 2, 26)]
MAX_TOKENS = 60
PREDICTION = '{"name":"ab","age":7}'


@pytest.fixture(scope="module")
def eng(llama_lm) -> Engine:
    return Engine(llama_lm)


def sampling(eng: Engine, schema: str, max_tokens: int = MAX_TOKENS) -> SamplingParams:
    """Greedy. With nothing required the random model would write '{}' (optional) or never
    close a key (json_object): a logit bias (target and draft alike) steers it."""
    bias: tuple[tuple[int, float], ...] = ()
    if schema == "optional":
        bias = ((eng.tokenizer.convert_tokens_to_ids("}"), -4.0),)
    elif schema == "json_object":
        bias = ((eng.tokenizer.convert_tokens_to_ids('"'), 4.0),)
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, logit_bias=bias)


def request(
    eng: Engine, schema: str, prompt, mode="standard", proposer=None, max_tokens=MAX_TOKENS
):
    grammar = compile_json_grammar(eng.tokenizer, SCHEMAS[schema], eng.target.vocab_size).new()
    return DecodeRequest(
        prompt,
        sampling(eng, schema, max_tokens),
        mode=mode,
        proposer=proposer,
        grammar=grammar,
        prediction=PREDICTION if proposer == "prediction" else None,
    )


_standard: dict[tuple, DecodeResult] = {}


def standard(eng: Engine, schema: str, prompt, max_tokens: int = MAX_TOKENS) -> DecodeResult:
    key = (schema, prompt, max_tokens)
    if key not in _standard:
        _standard[key] = eng.run(request(eng, schema, prompt, max_tokens=max_tokens))
    return _standard[key]


def check_valid(eng: Engine, res: DecodeResult, schema: str) -> None:
    if res.finish_reason == "stop":
        assert res.token_ids[-1] in eng.target.eos_token_ids
        validate_output(res.text, SCHEMAS[schema])
    else:
        assert res.finish_reason == "length" and len(res.token_ids) == MAX_TOKENS


@pytest.mark.parametrize("proposer", ["draft", "prompt_lookup", "prediction"])
@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_speculative_greedy_equals_standard_and_is_valid(eng, draft_lm, schema, proposer) -> None:
    stops = 0
    for prompt in PROMPTS:
        std = standard(eng, schema, prompt)
        res = eng.run(request(eng, schema, prompt, "speculative", proposer), draft=draft_lm)
        assert res.token_ids == std.token_ids, (schema, prompt, std.text, res.text)
        assert res.finish_reason == std.finish_reason
        check_valid(eng, std, schema)
        stops += std.finish_reason == "stop"
        if proposer == "draft":
            assert res.stats.drafted > 0
    assert stops, "no output finished: the validity check above never ran"


@cache
def unconstrained_is_not_json(eng: Engine) -> bool:
    res = eng.run(DecodeRequest(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=20)))
    return not res.text.startswith("{")


def test_outputs_are_json_only_because_of_the_grammar(eng) -> None:
    """Negative control: the random model does not write JSON on its own."""
    assert unconstrained_is_not_json(eng)
    assert standard(eng, "person", PROMPTS[0]).text.startswith('{"name":"')


@pytest.mark.parametrize("proposer", ["draft", "prompt_lookup"])
def test_max_tokens_cut_gives_length(eng, draft_lm, proposer) -> None:
    for schema in ("person", "nested"):
        std = standard(eng, schema, PROMPTS[0], max_tokens=7)
        req = request(eng, schema, PROMPTS[0], "speculative", proposer, max_tokens=7)
        res = eng.run(req, draft=draft_lm)
        assert std.finish_reason == res.finish_reason == "length"
        assert res.token_ids == std.token_ids and len(res.token_ids) == 7


@pytest.mark.parametrize("schema", ["person", "nested", "json_object"])
def test_sampled_speculative_outputs_are_valid(eng, draft_lm, schema) -> None:
    eos = eng.target.eos_token_ids[0]
    for seed in range(3):
        sp = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=seed)
        grammar = compile_json_grammar(eng.tokenizer, SCHEMAS[schema], eng.target.vocab_size)
        for mode, proposer in (("speculative", "draft"), ("speculative", "prompt_lookup")):
            req = DecodeRequest(PROMPTS[seed], sp, mode, proposer, grammar=grammar.new())
            res = eng.run(req, draft=draft_lm)
            check_valid(eng, res, schema)
            assert eos not in res.token_ids[:-1]


# -- exact distribution of one speculative step under the grammar mask ------------------------


def grammar_states(eng: Engine) -> list[tuple[str, torch.Tensor]]:
    """(prefix, mask) for several states of the person schema, masks with the loop's EOS rule."""
    tok, vocab = eng.tokenizer, eng.target.vocab_size
    compiled = compile_json_grammar(tok, SCHEMAS["person"], vocab)
    out = []
    for prefix in ('{"name":"', '{"name":"ab","age":', '{"name":"ab","age":1', '{"name":"ab'):
        g = compiled.new()
        for t in tok(prefix, add_special_tokens=False)["input_ids"]:
            g.consume(t)
        out.append(
            (prefix, next_token_mask(g, vocab, eng.target.eos_token_ids, torch.device("cpu")))
        )
    return out


def emitted(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact distribution of the token emitted at draft position 1: accepted draft mass plus
    P(reject) * residual(p, q). p, q (V,) fp64."""
    acc = torch.zeros_like(p)
    drafted = q > 0
    acc[drafted] = acceptance_probability(p[drafted], q[drafted])
    accepted = q * acc  # (V,)
    return accepted + (1.0 - accepted.sum()) * residual(p, q)


def masked_reference(logits: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) restricted to the mask and renormalised (fp64), computed directly."""
    w = torch.exp((logits - logits.max()) / temperature) * mask  # (V,)
    return w / w.sum()


@pytest.mark.parametrize("trial", range(4))
def test_one_step_emits_the_masked_renormalised_target(eng, trial) -> None:
    vocab = eng.target.vocab_size
    gen = torch.Generator().manual_seed(trial)
    shaper = LogitsShaper.from_params(SamplingParams(temperature=0.8), vocab, torch.device("cpu"))
    for prefix, mask in grammar_states(eng):
        assert 1 < int(mask.sum()) < vocab, prefix
        target_logits = torch.randn(vocab, generator=gen, dtype=torch.float64) * 3
        draft_logits = torch.randn(vocab, generator=gen, dtype=torch.float64) * 3
        p = shaper.probs(shaper.shape(target_logits[None], mask[None]))[0].double()
        q = shaper.probs(shaper.shape(draft_logits[None], mask[None]))[0].double()
        ref = masked_reference(target_logits, mask, 0.8)
        torch.testing.assert_close(p, ref, atol=1e-6, rtol=0)
        out = emitted(p, q)
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
        assert float(out[~mask].sum()) == 0.0
        # negative control: a target left unmasked emits tokens the grammar forbids
        p_raw = shaper.probs(shaper.shape(target_logits[None]))[0].double()
        assert float(emitted(p_raw, q)[~mask].sum()) > 1e-3


def test_verify_sampled_matches_the_masked_target_statistically(eng) -> None:
    """The real verify_sampled, 4000 draws at a state with a small support (TV noise ~0.02)."""
    vocab = eng.target.vocab_size
    prefix, mask = grammar_states(eng)[2]  # after '"age":1': digits, ',' '}' ...
    support = int(mask.sum())
    assert 2 < support < 40, support
    gen = torch.Generator().manual_seed(7)
    shaper = LogitsShaper.from_params(SamplingParams(temperature=1.0), vocab, torch.device("cpu"))
    z_p = shaper.shape(torch.randn(2, vocab, generator=gen) * 2, mask[None].expand(2, -1))
    p = shaper.probs(z_p)  # (2, V): positions 1 and bonus
    q = shaper.probs(shaper.shape(torch.randn(1, vocab, generator=gen) * 2, mask[None]))  # (1, V)
    n = 4000
    counts = torch.zeros(vocab, dtype=torch.float64)
    for _ in range(n):
        d = torch.multinomial(q[0], 1, generator=gen)  # (1,)
        verdict = verify_sampled(d, q, p, gen)
        counts[int(d) if verdict.accepted else verdict.token] += 1
    freq = counts / n
    assert float(freq[~mask].sum()) == 0.0
    tv = 0.5 * float((freq - p[0].double()).abs().sum())
    tv_pq = 0.5 * float((p[0] - q[0]).abs().sum())
    assert tv < 0.05 < 0.3 < tv_pq, (prefix, tv, tv_pq)  # p and q differ: the test has teeth
