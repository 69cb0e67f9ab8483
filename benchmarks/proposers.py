"""Proposers side by side: standard, draft v2, prompt lookup and suffix decoding (issue 47).

    python -m benchmarks [--quick] proposers

Greedy, one client (Engine.run, one request at a time), the demo pair of
models_registry/demo/manifest.yaml, adaptive k in [1, 16], 128 new tokens. Two workloads:

- heldout: benchmarks/prompts/heldout.jsonl (held-out standard-library code), one request
  per prompt, in order.
- agentic: a constructed agent session over the same files, in order, per file:
  1. read:   the file's code (a tool result) -> the model's continuation.
  2. edit:   the conversation so far (code + continuation), a comment asking for the code
             again with one edit, and the edited code's first lines: the model re-emits
             the earlier code (with the edit where it goes).
  3. retry:  the read again, byte for byte (an agent re-running the same tool call).
  4. log:    a JSON log of the session's tool calls so far, one call a line, for the
             model to continue (repeated calls of the same few tools).
  The suffix proposer gets one tenant index for the whole workload, fed with each finished
  request's prompt and output (what gateway/serving/suffix_store.py does), empty at the
  start of every timed run: it sees only the session's earlier requests.

The feature head (issue 47; models_registry/demo's draft version of kind `head`, loaded on
the target as the gateway's pool loads it) runs as config "head" beside draft v2 when the
manifest has one.

Draft trees (issue 47; proposers/tree.py, shape TREE or PROPOSERS_TREE="3,2"): a tree
request decodes in a one-row continuous batch (Engine.stream routes it there), so draft v2
and the head run on that path twice, as a chain ("draft_v2_batch", "head_batch") and as a
tree ("draft_v2_tree", "head_tree"): chain against tree on the same path, in one run.

PROPOSERS_WORKLOADS=heldout runs the held-out set only.

Reported per config and workload: tau = tokens per target forward (1.0 for standard),
acceptance = accepted / drafted, tokens/s, speed over standard (median of paired per-run
ratios) and whether the output equals standard decoding's. Configs are interleaved per
request so that load on the shared machine hits them alike. The goals from the issue:
suffix's tau >= 2x prompt lookup's on the agentic workload; the head's tau >= 5.0 on the
held-out set with a chain, and its tokens/s >= 1.25x draft v2's there.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks._pairs import load_pair
from gateway.engine import (
    DecodeRequest,
    DecodeResult,
    Engine,
    LoadedModel,
    SamplingParams,
    load_head_model,
)  # fmt: skip
from gateway.engine.backends.base import decode_alone
from gateway.engine.proposers.suffix import SuffixIndex
from gateway.engine.schema import Finished

HERE = Path(__file__).resolve().parent
HELDOUT = HERE / "prompts" / "heldout.jsonl"
NEW_TOKENS = 128
K_MIN, K_MAX = 1, 16  # the policy range speculative tenants are given here (default: 1-8)
BUDGET = 65_536  # the serving layer's default per-tenant budget
CONFIGS = ("standard", "draft_v2", "prompt_lookup", "suffix", "draft_v2_batch", "draft_v2_tree")
HEAD_CONFIGS = ("head", "head_batch", "head_tree")
TREE = tuple(int(w) for w in os.environ.get("PROPOSERS_TREE", "3,2").split(","))
TOOLS = ("read_file", "apply_edit", "run_tests")


class _Tenant:
    """The workload's one tenant index (a SuffixSource), fed after every suffix request."""

    def __init__(self) -> None:
        self.suffix = SuffixIndex(BUDGET)

    def index(self) -> SuffixIndex:
        return self.suffix


@dataclass
class _Runs:
    seconds: list[float] = field(default_factory=list)  # per run, all requests
    results: list[DecodeResult] = field(default_factory=list)  # of the last run


def _files(quick: bool) -> list[dict[str, str]]:
    lines = [json.loads(x) for x in HELDOUT.read_text().splitlines() if x.strip()]
    return lines[:3] if quick else lines


def _edit(code: str) -> str:
    """One edit an agent might make: rename the first function's first parameter after
    self (or `self` itself), else add a comment line."""
    for old, new in ((", node", ", tree"), ("(self, ", "(self, *, "), ("self", "this")):
        if old in code:
            return code.replace(old, new, 1)
    return "# edited\n" + code


def _agentic_prompts(engine: Engine, files: list[dict[str, str]]) -> list[list[str]]:
    """Per file, the session's four prompts; later prompts hold the target's own greedy
    continuations of the earlier ones (computed here once, standard decoding)."""
    sessions: list[list[str]] = []
    log: list[str] = []
    for f in files:
        code = f["prompt"]
        read = f"# tool: read_file path={f['name']}\n{code}"
        out = _greedy_text(engine, read)
        edited = _edit(code)
        head = "\n".join(edited.splitlines()[:3]) + "\n"
        edit = (
            f"{read}{out}\n\n# tool: apply_edit path={f['name']} (the code again, edited)\n{head}"
        )
        for tool in TOOLS:
            log.append(json.dumps({"tool": tool, "arguments": {"path": f["name"]}}))
        sessions.append([read, edit, read, "\n".join(log) + "\n"])
    return sessions


def _greedy_text(engine: Engine, text: str) -> str:
    ids = tuple(engine.tokenizer(text, add_special_tokens=False)["input_ids"])
    return engine.run(
        DecodeRequest(ids, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))
    ).text


def _requests(
    p: tuple[int, ...], tenant: _Tenant, draft: LoadedModel, head: LoadedModel | None = None
) -> list[tuple[str, DecodeRequest, LoadedModel | None]]:
    sp = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    spec: dict[str, Any] = {"mode": "speculative", "proposer": "draft", "k_min": K_MIN,
                            "k_max": K_MAX}  # fmt: skip
    tree = {**spec, "tree": TREE}
    suffix = {**spec, "proposer": "suffix"}
    out: list[tuple[str, DecodeRequest, LoadedModel | None]] = [
        ("standard", DecodeRequest(p, sp), None),
        ("draft_v2", DecodeRequest(p, sp, **spec), draft),
        ("prompt_lookup", DecodeRequest(p, sp, **{**spec, "proposer": "prompt_lookup"}), None),
        ("suffix", DecodeRequest(p, sp, suffix_source=tenant, **suffix), None),
        ("draft_v2_batch", DecodeRequest(p, sp, **spec), draft),
        ("draft_v2_tree", DecodeRequest(p, sp, **tree), draft),
    ]
    if head is not None:
        out += [
            ("head", DecodeRequest(p, sp, **spec), head),
            ("head_batch", DecodeRequest(p, sp, **spec), head),
            ("head_tree", DecodeRequest(p, sp, **tree), head),
        ]
    return out


def _decode(engine: Engine, name: str, req: DecodeRequest, d: LoadedModel | None) -> DecodeResult:
    """Engine.run, or for the "_batch" configs the same request in a one-row batch (where
    Engine.stream decodes a tree request)."""
    if not name.endswith("_batch"):
        return engine.run(req, draft=d)
    for item in decode_alone(engine.batch(1), engine.prepare(req, d), None):
        if isinstance(item, Finished):
            return item.result
    raise AssertionError("the batch ended without a Finished item")


def _demo_head(target: LoadedModel) -> LoadedModel | None:
    """The demo manifest's newest draft of kind `head`, on the target; None without one."""
    import yaml

    manifest = HERE.parent / "models_registry" / "demo" / "manifest.yaml"
    heads = [e for e in yaml.safe_load(manifest.read_text())["models"] if e.get("kind") == "head"]
    if not heads:
        return None
    return load_head_model(str(manifest.parent / heads[-1]["path"]), target)


def _workload(
    engine: Engine, draft: LoadedModel, prompts: list[tuple[int, ...]], runs: int,
    head: LoadedModel | None = None,
) -> dict[str, Any]:  # fmt: skip
    names = (*CONFIGS, *HEAD_CONFIGS) if head is not None else CONFIGS
    configs = {name: _Runs() for name in names}
    for _ in range(runs):
        tenant = _Tenant()  # empty at the start of every run
        secs = dict.fromkeys(names, 0.0)
        results: dict[str, list[DecodeResult]] = {n: [] for n in names}
        for p in prompts:
            for name, req, d in _requests(p, tenant, draft, head):
                t0 = time.perf_counter()
                res = _decode(engine, name, req, d)
                secs[name] += time.perf_counter() - t0
                results[name].append(res)
            tenant.suffix.add((*p, *results["suffix"][-1].token_ids))
        for name in names:
            configs[name].seconds.append(secs[name])
            configs[name].results = results[name]
    base = configs["standard"]
    return {
        "requests": len(prompts),
        "prompt_tokens": sum(map(len, prompts)),
        "configs": {name: _summary(cr, base) for name, cr in configs.items()},
    }


def _summary(run: _Runs, base: _Runs) -> dict[str, Any]:
    tokens = sum(len(r.token_ids) for r in run.results)
    forwards = sum(r.stats.target_forwards for r in run.results)
    drafted = sum(r.stats.drafted for r in run.results)
    accepted = sum(r.stats.accepted for r in run.results)
    secs = statistics.median(run.seconds)
    ratios = [b / s for b, s in zip(base.seconds, run.seconds, strict=True)]
    return {
        "tokens": tokens,
        "target_forwards": forwards,
        "tau": round(tokens / max(forwards, 1), 3),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": round(accepted / drafted, 4) if drafted else None,
        "seconds_median": round(secs, 3),
        "seconds_runs": [round(s, 3) for s in run.seconds],
        "tokens_per_s": round(tokens / secs, 2),
        "speed_over_standard": round(statistics.median(ratios), 3),
        "same_output_as_standard": [r.token_ids for r in run.results]
        == [r.token_ids for r in base.results],
    }


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    threads = int(os.environ.get("ENGINE_BENCH_THREADS", "0")) or torch.get_num_threads()
    torch.set_num_threads(threads)
    pair = load_pair()
    engine = Engine(pair.target)
    draft = pair.drafts["v2"]
    head = _demo_head(pair.target)
    files = _files(quick)
    tok = engine.tokenizer

    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok(text, add_special_tokens=False)["input_ids"])

    chosen = os.environ.get("PROPOSERS_WORKLOADS", "heldout,agentic").split(",")
    prompts = {"heldout": [ids(f["prompt"]) for f in files]}
    if "agentic" in chosen:
        prompts["agentic"] = [ids(t) for sess in _agentic_prompts(engine, files) for t in sess]
    heldout = prompts["heldout"]
    runs = 1 if quick else 2
    _workload(engine, draft, heldout[:1], 1, head)  # warm-up: every config once
    result: dict[str, Any] = {
        "models": pair.source,
        "device": str(pair.target.device),
        "torch_threads": threads,
        "new_tokens": NEW_TOKENS,
        "k": [K_MIN, K_MAX],
        "runs": runs,
        "workloads": {
            name: _workload(engine, draft, prompts[name], runs, head)
            for name in ("heldout", "agentic") if name in prompts
        },
    }  # fmt: skip
    if "agentic" in prompts:
        ag = result["workloads"]["agentic"]["configs"]
        ratio = ag["suffix"]["tau"] / max(ag["prompt_lookup"]["tau"], 1e-9)
        result["goal"] = {
            "suffix_tau_over_prompt_lookup_agentic": round(ratio, 3),
            "target": 2.0,
            "met": ratio >= 2.0,
        }
    if head is not None:
        held = result["workloads"]["heldout"]["configs"]
        speed = held["head"]["tokens_per_s"] / max(held["draft_v2"]["tokens_per_s"], 1e-9)
        result["goal_head"] = {
            "head": head.path.split("models_registry/")[-1],
            "tau_heldout": held["head"]["tau"],
            "tau_target": 5.0,
            "tokens_per_s_over_draft_v2_heldout": round(speed, 3),
            "speed_target": 1.25,
            "met": held["head"]["tau"] >= 5.0 and speed >= 1.25,
            "tau_tree_heldout": held["head_tree"]["tau"],
            "tau_tree_target": 5.5,
            "tree_met": held["head_tree"]["tau"] >= 5.5,
        }
    result["tree"] = {"shape": list(TREE), "heldout": _tree_ratios(result["workloads"]["heldout"])}
    return result


def _tree_ratios(workload: dict[str, Any]) -> dict[str, Any]:
    """Tree over chain on the same (one-row batch) path: tau and tokens/s."""
    c = workload["configs"]
    out = {}
    for name in ("draft_v2", "head"):
        chain, tree = c.get(f"{name}_batch"), c.get(f"{name}_tree")
        if chain is not None and tree is not None:
            out[name] = {
                "tau_chain": chain["tau"],
                "tau_tree": tree["tau"],
                "tokens_per_s_tree_over_chain": round(
                    tree["tokens_per_s"] / max(chain["tokens_per_s"], 1e-9), 3
                ),
            }
    return out


def table(result: dict[str, Any]) -> str:
    rows = ["workload  config          tau    accept  tok/s   x std  same"]
    for wname, w in result["workloads"].items():
        for name, c in w["configs"].items():
            acc = "-" if c["acceptance"] is None else f"{c['acceptance']:.3f}"
            rows.append(
                f"{wname:9} {name:14} {c['tau']:6.3f} {acc:>7} {c['tokens_per_s']:7.1f} "
                f"{c['speed_over_standard']:6.3f}  {c['same_output_as_standard']}"
            )
    g = result.get("goal")
    if g is not None:
        ratio, met = g["suffix_tau_over_prompt_lookup_agentic"], "met" if g["met"] else "missed"
        rows.append(f"suffix tau / prompt lookup tau (agentic): {ratio} (goal >= 2.0: {met})")
    h = result.get("goal_head")
    if h is not None:
        rows.append(
            f"head (held-out): tau {h['tau_heldout']} (goal >= 5.0), tokens/s "
            f"{h['tokens_per_s_over_draft_v2_heldout']}x draft v2's (goal >= 1.25): "
            f"{'met' if h['met'] else 'missed'}; with a tree tau {h['tau_tree_heldout']} "
            f"(goal >= 5.5: {'met' if h['tree_met'] else 'missed'})"
        )
    for name, r in result.get("tree", {}).get("heldout", {}).items():
        rows.append(
            f"{name} tree {result['tree']['shape']} over its chain (held-out, one-row batch): "
            f"tau {r['tau_chain']} -> {r['tau_tree']}, "
            f"tokens/s {r['tokens_per_s_tree_over_chain']}x"
        )
    return "\n".join(rows)
