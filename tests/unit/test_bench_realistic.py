"""benchmarks/realistic.py's parts that decide what it reports: the weights' recipe (greedy
decoding never produces an id past the tokenizer or a special token, and does not collapse
into one token), the goals' pass/fail, and the 7B extrapolation of the start's parts.
The benchmark itself builds 0.5B-1.5B models: far too slow for a unit test."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks._realistic_models import init_weights
from benchmarks.realistic import PARAMS_7B, _extrapolate, _goals, _same


def tiny(layers: int = 4) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=600, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
        tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg).eval()


def test_recipe_never_produces_unusable_ids_and_does_not_collapse() -> None:
    model = tiny()
    init_weights(model, usable=500, draft_layers=2)
    emb = model.model.embed_tokens.weight
    assert emb[500:].abs().max() == 0 and emb[:3].abs().max() == 0
    assert model.lm_head.weight is emb  # still tied
    ids = torch.tensor([[17, 250, 33, 401, 12, 9]])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0)[0, 6:]
    assert out.min() >= 3 and out.max() < 500
    assert len(set(out.tolist())) > 8  # not one token repeated


def test_recipe_scales_the_layers_past_the_draft_down() -> None:
    model = tiny(layers=6)
    init_weights(model, usable=500, draft_layers=2)
    layers = model.model.layers
    first = layers[0].self_attn.o_proj.weight.std().item()
    later = layers[4].self_attn.o_proj.weight.std().item()
    assert first == pytest.approx(1 / math.sqrt(64), rel=0.1)
    assert later < first / 5


def case(std1: float, spec1: float, hf1: float, rss: float, ready: float) -> dict:
    return {
        "tokens_per_s": {"standard_1": std1, "speculative_1": spec1, "hf_generate_1": hf1},
        "memory": {"rss_over_budget": rss},
        "start": {"restart": {"ready_from_process_start_s": ready}},
    }


def test_goals_pass_and_fail_on_their_thresholds() -> None:
    goals = _goals({
        "qwen2.5-0.5b/float32": case(10, 12, 11, 1.2, 90),
        "qwen2.5-1.5b/bfloat16/off": case(4, 3.9, 4.5, 1.31, 59.5),
    })  # fmt: skip
    assert "qwen2.5-0.5b/float32" not in goals["ready_1.5b_restart_under_60s"]
    assert goals["ready_1.5b_restart_under_60s"]["qwen2.5-1.5b/bfloat16/off"]["pass"]
    small, large = "qwen2.5-0.5b/float32", "qwen2.5-1.5b/bfloat16/off"
    assert goals["rss_under_1.3x_budget"][small]["pass"]
    assert not goals["rss_under_1.3x_budget"][large]["pass"]
    assert goals["standard_1_at_least_0.9x_hf"][small]["pass"]  # 10 / 11 = 0.909
    assert not goals["standard_1_at_least_0.9x_hf"][large]["pass"]  # 4 / 4.5
    assert goals["speculative_1_over_standard_1"][small]["pass"]
    assert not goals["speculative_1_over_standard_1"][large]["pass"]


def test_extrapolation_is_a_line_through_the_shapes_and_counts_each_part_once() -> None:
    def restart(sha: float, load: float, inside: float) -> dict:
        parts = {"sha256": sha, "load_model": load, "from_pretrained": inside}
        return {"start": {"restart": {"imports_s": 5.0, "target_parts_s": parts}}}

    cases = {"a/bfloat16": restart(1.0, 4.0, 3.0), "b/bfloat16/off": restart(3.0, 10.0, 8.0)}
    built = {"a": {"parameters": 1_000_000_000}, "b": {"parameters": 2_000_000_000}}
    got = _extrapolate(cases, built)["bfloat16"]
    per_billion = (PARAMS_7B - 2_000_000_000) / 1e9
    assert got["parts_s"]["sha256"] == pytest.approx(3.0 + 2.0 * per_billion, abs=0.05)
    assert got["parts_s"]["imports"] == 5.0
    load = 10.0 + 6.0 * per_billion
    # from_pretrained runs inside load_model: the total counts it once
    assert got["ready_s"] == pytest.approx(5.0 + 3.0 + 2.0 * per_billion + load, abs=0.2)


def test_same_is_the_share_of_equal_outputs() -> None:
    assert _same([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == 0.5


def test_a_case_compares_with_the_generate_rounds_of_its_own_process() -> None:
    from benchmarks.realistic import _case

    def run(rate: float, outputs: list[list[int]], acceptance: float | None = None) -> dict:
        return {"tokens_per_s": rate, "rounds_tokens_per_s": [rate], "seconds": 1.0,
                "acceptance": acceptance, "outputs": outputs}  # fmt: skip

    same, other = [[5, 6, 7]], [[5, 6, 8]]
    rss = {"rss": 300, "peak": 320}
    restart = {
        "runs": {"standard_1": run(9.0, same), "speculative_1": run(12.0, same, 0.7),
                 "hf_generate_1": run(10.0, other)},
        "weight_bytes": 200, "kv_bytes": 50, "draft_head_bytes": 10, "rss_ready": rss,
        "rss_draft_loaded": rss, "rss_end": rss, "rss_imports": 40, "linear_form": "torch",
        "packs_end": {"kept": 0, "made": 0},
    }  # fmt: skip
    first = {"rss_draft_loaded": rss}
    got = _case({}, first, restart, {"rss_end": rss, "load_s": 1.0}, one_client=1)
    assert got["tokens_per_s"]["hf_generate_1"] == 10.0
    assert got["identical_outputs"] == {"speculative_1_vs_standard_1": 1.0,
                                        "hf_1_vs_standard_1": 0.0}  # fmt: skip
    assert got["memory"]["rss_over_budget"] == 1.2  # 300 / (200 + 50)
    goals = _goals({"qwen2.5-0.5b/float32": got})
    assert goals["standard_1_at_least_0.9x_hf"]["qwen2.5-0.5b/float32"] == {
        "ratio": 0.9, "pass": True}  # fmt: skip


def test_a_report_only_run_keeps_every_case_an_earlier_run_finished(tmp_path, monkeypatch) -> None:
    """REALISTIC_PARTS=none with REALISTIC_RESUME=1: the report holds every finished case,
    the last of the plan's included (a resumed case must not skip the partial's write)."""
    import json

    from benchmarks import realistic

    cached = {"a/float32": {"x": 1}, "b/float32": {"x": 2}, "_models": {"a": {}, "b": {}, "c": {}}}
    (tmp_path / "partial.json").write_text(json.dumps(cached))
    monkeypatch.setattr(realistic, "CACHE", tmp_path)
    for name in ("_prompt_ids", "_goals", "_extrapolate", "_plot", "_machine", "_llamacpp"):
        monkeypatch.setattr(realistic, name, lambda *a, **k: None)
    monkeypatch.setattr(realistic, "torch_threads", lambda: 1)
    monkeypatch.setenv("REALISTIC_RESUME", "1")
    monkeypatch.setenv("REALISTIC_PARTS", "none")
    plan = {"cases": ("a/float32", "c/float32", "b/float32"), "new_tokens": 1, "one_client": 1,
            "clients": (1,), "rounds": 1}  # fmt: skip
    got = realistic.run(tmp_path, plan=plan)
    assert set(got["cases"]) == {"a/float32", "b/float32"}
    kept = json.loads((tmp_path / "partial.json").read_text())
    assert {"a/float32", "b/float32"} <= set(kept)
