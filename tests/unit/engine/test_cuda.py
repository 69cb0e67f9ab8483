"""On CUDA in half precision, greedy speculative decoding equals standard decoding.

Half-precision kernels may round a 1-token and a (k+1)-token forward differently, so where
the two outputs part, the target's top-2 logits there must be a near tie.
"""

from __future__ import annotations

import pytest
import torch

from gateway.engine import DecodeRequest, Engine, SamplingParams
from gateway.speed import load_fast
from gateway.speed.fast import compiled_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("proposer", ["draft", "prompt_lookup"])
def test_greedy_spec_equals_standard_on_cuda(model_dirs, dtype, proposer) -> None:
    target = load_fast(model_dirs["llama"], device="cuda", dtype=dtype)
    draft = load_fast(model_dirs["draft"], device="cuda", dtype=dtype)
    assert target.device.type == "cuda" and target.dtype == dtype
    eng = Engine(target)
    prompt = (10, 20, 30, 40, 50, 10, 20)
    sp = SamplingParams(temperature=0.0, max_tokens=40)
    std = eng.run(DecodeRequest(prompt, sp)).token_ids
    req = DecodeRequest(prompt, sp, mode="speculative", proposer=proposer, k_min=2, k_max=6)
    spec = eng.run(req, draft=draft).token_ids
    if spec != std:
        j = next(i for i, (a, b) in enumerate(zip(spec, std, strict=False)) if a != b)
        ids = torch.tensor([prompt + std[:j]], device="cuda")
        with torch.no_grad():
            top2 = target.model(input_ids=ids).logits[0, -1].float().topk(2).values
        assert float(top2[0] - top2[1]) < 0.05, f"outputs part at {j} without a near tie"


def test_default_dtype_on_cuda_is_bf16(model_dirs) -> None:
    assert load_fast(model_dirs["llama"]).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_draft_head_loads_and_drafts_on_cuda(model_dirs, dtype, tmp_path) -> None:
    """The load-time check of a reduced head passes in half precision, and greedy output is
    still the standard one (up to near ties, as above)."""
    import json
    import shutil

    from gateway.engine.draft_head import DRAFT_VOCAB_FILE

    draft_dir = tmp_path / "draft"
    shutil.copytree(model_dirs["draft"], draft_dir)
    (draft_dir / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": list(range(0, 300, 2))}))
    target = load_fast(model_dirs["llama"], device="cuda", dtype=dtype)
    draft = load_fast(draft_dir, device="cuda", dtype=dtype)
    assert draft.draft_head is not None and draft.draft_head.token_ids.device.type == "cuda"
    eng = Engine(target)
    sp = SamplingParams(temperature=0.0, max_tokens=30)
    prompt = (10, 20, 30, 40, 50)
    std = eng.run(DecodeRequest(prompt, sp)).token_ids
    req = DecodeRequest(prompt, sp, mode="speculative", proposer="draft", k_min=2, k_max=6)
    res = eng.run(req, draft=draft)
    assert res.stats.drafted > 0
    if res.token_ids != std:
        j = next(i for i, (a, b) in enumerate(zip(res.token_ids, std, strict=False)) if a != b)
        ids = torch.tensor([prompt + std[:j]], device="cuda")
        with torch.no_grad():
            top2 = target.model(input_ids=ids).logits[0, -1].float().topk(2).values
        assert float(top2[0] - top2[1]) < 0.05, f"outputs part at {j} without a near tie"


def test_a_mixed_batch_on_cuda_gives_every_row_its_alone_output(model_dirs) -> None:
    """The batch path on the GPU, fp32 (no half-precision ties): standard, draft-model and
    prompt-lookup rows joining at different steps; the forward costs probe runs too."""
    from tests.support.batch import PROMPTS, Job, greedy, run_batch

    target = load_fast(model_dirs["llama"], device="cuda", dtype=torch.float32)
    draft = load_fast(model_dirs["draft"], device="cuda", dtype=torch.float32)
    eng = Engine(target)
    costs = eng.measure_costs(4)
    assert costs.seconds(4, 3) is not None
    spec = {"mode": "speculative", "k_min": 1, "k_max": 4}
    jobs = [
        Job(0, DecodeRequest(PROMPTS[0], greedy(20))),
        Job(0, DecodeRequest(PROMPTS[1], greedy(24), proposer="draft", **spec), draft),
        Job(2, DecodeRequest(PROMPTS[2], greedy(16), proposer="prompt_lookup", **spec)),
        Job(3, DecodeRequest(PROMPTS[3], greedy(18), proposer="draft", may_pause=True, **spec),
            draft),
    ]  # fmt: skip
    solo = [eng.run(j.req, j.draft).token_ids for j in jobs]
    got = [r.token_ids for r in run_batch(eng, jobs)]
    assert got == solo


def test_the_compiled_step_on_cuda_decodes_what_eager_decodes(model_dirs) -> None:
    """The compiled batch step (speed/compiled.py) on the GPU, fp32: a mixed batch decodes
    token for token what the eager batch decodes, and auto's per-kind timing runs there."""
    from gateway.speed.kinds import KINDS
    from gateway.speed.warmup import CompileOptions, compiled_model
    from tests.support.batch import mixed_jobs, run_batch

    target = load_fast(model_dirs["llama"], device="cuda", dtype=torch.float32)
    draft = load_fast(model_dirs["draft"], device="cuda", dtype=torch.float32)
    eager = run_batch(Engine(target), mixed_jobs(Engine(target), draft))
    fast_target, _ = compiled_model(target, 8)  # GATEWAY_COMPILE=on: every kind compiled
    fast_draft, _ = compiled_model(draft, 8, draft=True)
    assert compiled_of(fast_target) is not None and compiled_of(fast_target).kinds == KINDS
    engine = Engine(fast_target)
    got = run_batch(engine, mixed_jobs(engine, fast_draft))
    assert [r.token_ids for r in got] == [r.token_ids for r in eager]
    said: list[str] = []  # auto: each kind timed compiled and eager on the GPU
    auto, _ = compiled_model(target, 8, options=CompileOptions(measure=True), progress=said.append)
    assert "compiled/eager time by step kind" in said[-1]
    assert compiled_of(auto) is None or compiled_of(auto).kinds <= KINDS
