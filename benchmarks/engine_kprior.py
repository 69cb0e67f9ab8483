"""Where the engine's k policy starts: the default prior against the policy decision's prior.

    python -m benchmarks engine_kprior [--quick]

Demo pair, draft v2, held-out code prompts, greedy, 128 new tokens, k in [1, 8]. A warm-up
pass measures the acceptance and c the tenant's history would hold after some traffic;
the policy engine (the bundled default bundle) then decides a request with that history,
and the decision's acceptance and c become the k policy's prior (what the gateway does
since the serving redesign). "before" runs every prompt with the engine's default prior
(acceptance 0.7, c = draft layers / target layers); "after" with the decision's prior,
interleaved per prompt. Reported: the decision's k, the k chosen at each of the first
steps (median over prompts), mean k, tokens/s, and whether outputs are identical.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._pairs import ROOT, load_pair, load_prompts
from gateway.engine import DecodeRequest, DecodeResult, Engine, KPrior, SamplingParams
from policies import (
    Capabilities,
    DecisionContext,
    HistoryEntry,
    Load,
    PolicyStore,
    RequestFeatures,
    decide,
)

PROMPTS = Path(__file__).resolve().parent / "prompts" / "heldout.jsonl"
NEW_TOKENS, K_MIN, K_MAX, FIRST_STEPS = 128, 1, 8, 8
HISTORY_SAMPLES = 50  # as after 50 requests: above the bundle's auto.min_samples


def _request(prompt: tuple[int, ...], prior: KPrior | None) -> DecodeRequest:
    return DecodeRequest(
        prompt, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS), mode="speculative",
        proposer="draft", k_min=K_MIN, k_max=K_MAX, k_prior=prior,
    )  # fmt: skip


def _decision_prior(a: float, c: float, samples: int) -> tuple[KPrior, int | None]:
    """The decision the policy engine makes for a tenant whose history holds (a, c)."""
    store = PolicyStore()
    store.load_dir(str(ROOT / "policies" / "bundles"))
    features = RequestFeatures(
        endpoint="completions", model="demo-code-target", requested_mode="speculative",
        requested_proposer="draft", requested_k=None, max_tokens=NEW_TOKENS, temperature=0.0,
        top_p=1.0, seed=None, has_prediction=False, constraint="none", prompt_tokens=32,
    )  # fmt: skip
    history = {("draft", "2"): HistoryEntry(acceptance=a, c=c, samples=samples)}
    ctx = DecisionContext(
        tenant_id="bench", request=features, history=history, global_history={},
        load=Load(queue_depth=0, capacity=32), capabilities=Capabilities(("2",), "2"),
        previous_mode=None, probe_draw=1.0, decision_id="bench",
    )  # fmt: skip
    d = decide(store.active, ctx)
    assert d.mode == "speculative" and d.acceptance is not None and d.c is not None, d
    return KPrior(d.acceptance, d.c), d.k


def _first_steps(results: list[DecodeResult]) -> list[float]:
    ks = [r.stats.k_history for r in results]
    return [statistics.median(k[i] for k in ks if len(k) > i) for i in range(FIRST_STEPS)]


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    pair = load_pair()
    target, draft = pair.target, pair.drafts["v2"]
    engine = Engine(target)
    prompts = load_prompts(target.tokenizer, PROMPTS)[: 3 if quick else None]
    warm = [engine.run(_request(p, None), draft) for p in prompts]
    drafted = sum(r.stats.drafted for r in warm)
    a = sum(r.stats.accepted for r in warm) / max(drafted, 1)
    c = statistics.median(r.stats.c for r in warm if r.stats.c is not None)
    prior, decided_k = _decision_prior(a, c, samples=HISTORY_SAMPLES)
    runs: dict[str, list[DecodeResult]] = {"before": [], "after": []}
    seconds = {"before": 0.0, "after": 0.0}
    for p in prompts:
        for name, k_prior in (("before", None), ("after", prior)):
            t0 = time.perf_counter()
            runs[name].append(engine.run(_request(p, k_prior), draft))
            seconds[name] += time.perf_counter() - t0
    return {
        "setup": {
            "prompts": len(prompts),
            "new_tokens": NEW_TOKENS,
            "k": [K_MIN, K_MAX],
            "draft": "demo-code-draft@2",
            "models": pair.source,
        },
        "history": {"acceptance": round(a, 4), "c": round(c, 4)},
        "decision": {"k": decided_k, "acceptance": prior.acceptance, "c": prior.c},
        **{name: _summary(rs, seconds[name]) for name, rs in runs.items()},
        "outputs_identical": all(
            b.token_ids == x.token_ids for b, x in zip(runs["before"], runs["after"], strict=True)
        ),
    }


def _summary(results: list[DecodeResult], seconds: float) -> dict[str, Any]:
    tokens = sum(len(r.token_ids) for r in results)
    return {
        "first_k": _first_steps(results),
        "mean_k": round(statistics.mean(k for r in results for k in r.stats.k_history), 3),
        "tokens_per_s": round(tokens / seconds, 2),
    }


def table(result: dict[str, Any]) -> str:
    d, h = result["decision"], result["history"]
    rows = [
        f"   history a={h['acceptance']} c={h['c']} -> decision k={d['k']} "
        f"(prior a={d['acceptance']:.4f}, c={d['c']:.4f})",
    ]
    for name in ("before", "after"):
        r = result[name]
        rows.append(
            f"   {name:6} first k {r['first_k']}  mean k {r['mean_k']}  {r['tokens_per_s']} tok/s"
        )
    rows.append(f"   outputs identical: {result['outputs_identical']}")
    return "\n".join(rows)
