"""The regression gate before a promotion: greedy speculative output with the new draft must
equal standard output token for token on every prompt of the regression set. Runs on the
inference worker, one decoding step per worker turn, so live traffic keeps flowing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.engine import DecodeRequest, Engine, Finished, LoadedModel, SamplingParams
from gateway.serving.errors import GatewayError
from gateway.serving.worker import InferenceWorker, Overloaded
from models_registry import regression as reg


def _regression_steps(
    engine: Engine, draft: LoadedModel, prompts: tuple[reg.RegressionPrompt, ...], cancelled: Any
) -> Iterator[reg.RegressionResult | None]:
    """Decode every prompt greedily, standard then speculative; one decoding step per next()."""
    for p in prompts:
        ids = tuple(engine.tokenizer.encode(p.prompt, add_special_tokens=False))
        budget = max(1, min(p.max_new_tokens, engine.context_length - len(ids)))
        out: dict[str, tuple[int, ...]] = {}
        for mode in ("standard", "speculative"):
            req = DecodeRequest(
                prompt_ids=ids,
                sampling=SamplingParams(temperature=0, max_tokens=budget),
                mode=mode,  # type: ignore[arg-type]
                proposer="draft" if mode == "speculative" else None,
                k_min=1,
                k_max=4,
            )
            for item in engine.stream(req, draft if mode == "speculative" else None, cancelled):
                if isinstance(item, Finished):
                    out[mode] = item.result.token_ids
                yield None
        yield reg.RegressionResult(p.id, out["standard"], out["speculative"])


async def run_regression_gate(
    engine: Engine, draft: LoadedModel, worker: InferenceWorker, prompts_path: str | Path | None
) -> reg.GateVerdict:
    prompts = reg.load_regression_set(prompts_path)
    try:
        job = worker.submit(lambda c: _regression_steps(engine, draft, prompts, c))
    except Overloaded as exc:
        raise GatewayError("overloaded", str(exc), retry_after=exc.retry_after) from exc
    results = [x async for x in worker.events(job) if x is not None]
    return reg.gate(results, prompts)
