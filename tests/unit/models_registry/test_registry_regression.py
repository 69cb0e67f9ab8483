from __future__ import annotations

from pathlib import Path

import pytest

from models_registry.errors import RegistryError
from models_registry.regression import (
    RegressionResult,
    first_mismatch,
    gate,
    load_regression_set,
)


def same(pid: str, tokens: tuple[int, ...] = (5, 6, 7, 8)) -> RegressionResult:
    return RegressionResult(pid, tokens, tokens)


def test_bundled_set_loads() -> None:
    prompts = load_regression_set()
    assert 10 <= len(prompts) <= 16
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(p.prompt.strip() and p.max_new_tokens > 0 for p in prompts)


def test_identical_outputs_pass() -> None:
    prompts = load_regression_set()
    verdict = gate([same(p.id) for p in prompts], prompts)
    assert verdict.passed and verdict.first_mismatch is None
    assert verdict.checked == len(prompts)


def test_mismatch_blocks_and_names_prompt_and_position() -> None:
    results = [same("a"), RegressionResult("b", (1, 2, 3, 4), (1, 2, 9, 4)), same("c")]
    verdict = gate(results)
    assert not verdict.passed
    assert verdict.first_mismatch is not None
    assert (verdict.first_mismatch.prompt_id, verdict.first_mismatch.position) == ("b", 2)
    assert "prompt 'b'" in verdict.reason and "token 2" in verdict.reason
    assert "standard 3, speculative 9" in verdict.reason


def test_first_of_several_mismatches_is_reported() -> None:
    results = [RegressionResult("x", (1, 2), (1, 3)), RegressionResult("y", (1,), (2,))]
    assert gate(results).first_mismatch.prompt_id == "x"  # type: ignore[union-attr]


def test_length_difference_is_a_mismatch() -> None:
    m = first_mismatch(RegressionResult("p", (1, 2, 3), (1, 2)))
    assert m is not None and (m.position, m.standard_token, m.speculative_token) == (2, 3, None)
    assert not gate([RegressionResult("p", (1,), (1, 4))]).passed


def test_no_evidence_missing_or_duplicate_prompts_block() -> None:
    assert not gate([]).passed
    prompts = load_regression_set()
    partial = gate([same(p.id) for p in prompts[:-1]], prompts)
    assert not partial.passed and repr(prompts[-1].id) in partial.reason
    assert "more than one result" in gate([same("a"), same("a")]).reason


def test_bad_prompt_file(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "def f():"}\n{"prompt": "no id"}\n')
    with pytest.raises(RegistryError, match=":2:"):
        load_regression_set(path)
    path.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(RegistryError, match="duplicate prompt id 'a'"):
        load_regression_set(path)
