"""The engine benchmark on held-out standard-library code (the demo models' own held-out
split: files never trained on, generated encodings/ tables left out, cut at a `def`
near their middle; see
benchmarks/prompts/heldout.jsonl). This is the distribution the drafts were distilled on,
so it shows the engine when the draft agrees often; benchmarks/engine.py shows hand-written
prompts where it does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import engine

PROMPTS = Path(__file__).resolve().parent / "prompts" / "heldout.jsonl"


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    result = engine.run(out_dir, quick=quick, prompts_path=PROMPTS)
    result["prompt_set"] = str(PROMPTS.relative_to(PROMPTS.parents[2]))
    return result


def table(result: dict[str, Any]) -> str:
    return engine.table(result) if hasattr(engine, "table") else str(result.get("goals"))
