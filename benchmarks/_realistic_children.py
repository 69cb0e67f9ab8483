"""benchmarks/realistic.py's measuring children, each run in a process of its own
(`python -m benchmarks.realistic gateway|hf <json>`): the gateway's start path and the
engine's continuous batch and Hugging Face `generate` interleaved on a restarted process
(`gateway_child`), and the model as transformers loads it alone (`hf_child`: load time and
memory)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ROWS = 8  # the batch's rows (GATEWAY_MAX_BATCH's default)


def _rss() -> dict[str, int]:
    """Resident and peak resident bytes of this process (/proc/self/status)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out["rss" if key == "VmRSS" else "peak"] = int(value.split()[0]) * 1024
    return out


def _instrument(parts: dict[str, float]) -> None:
    """Time (accumulated into `parts`) each piece of work a start does."""
    import transformers

    import gateway.engine.models as em
    import gateway.serving.models as sm
    import gateway.speed.attach as sa
    from gateway.speed.lean import LeanDecoder

    def wrap(owner: Any, name: str, label: str, static: bool = False) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                parts[label] = parts.get(label, 0.0) + time.perf_counter() - t0

        setattr(owner, name, staticmethod(timed) if static else timed)

    wrap(sm, "verify_sha256", "sha256")
    wrap(sm, "load_fast", "load_model")
    wrap(sm, "check_pair", "check_pair")
    wrap(sm.ModelPool, "_probe", "cost_probe")
    wrap(em, "check_servable", "family_check")
    wrap(sa, "weight_major_pays", "linear_verdict")
    wrap(sa, "unchecked_decoder", "lean_decoder")
    wrap(LeanDecoder, "checked", "lean_parity_check")
    wrap(transformers.AutoModelForCausalLM, "from_pretrained", "from_pretrained", static=True)
    wrap(transformers.AutoTokenizer, "from_pretrained", "tokenizer", static=True)


def _decode(
    engine: Any, batch: Any, prompts: list[tuple[int, ...]], spec: bool, draft: Any,
    clients: int, new_tokens: int,
) -> dict[str, Any]:  # fmt: skip
    """`clients` requests at a time in the batch until every prompt is served."""
    from gateway.engine import DecodeRequest, Finished, SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    kw: dict[str, Any] = {"mode": "speculative", "proposer": "draft"} if spec else {}
    outputs: list[list[int]] = [[] for _ in prompts]
    drafted = accepted = 0
    t0 = time.perf_counter()
    for start in range(0, len(prompts), clients):
        index = {}
        for i in range(start, min(len(prompts), start + clients)):
            req = DecodeRequest(prompts[i], sp, **kw)
            index[id(batch.add(engine.prepare(req, draft if spec else None)))] = i
        while batch.rows:
            for row, events in batch.step():
                for e in events:
                    if isinstance(e, Exception):
                        raise e
                    if isinstance(e, Finished):
                        outputs[index[id(row)]] = list(e.result.token_ids)
                        drafted += e.result.stats.drafted
                        accepted += e.result.stats.accepted
    wall = time.perf_counter() - t0
    tokens = sum(len(o) for o in outputs)
    return {
        "tokens": tokens, "seconds": round(wall, 2), "tokens_per_s": round(tokens / wall, 2),
        "acceptance": round(accepted / drafted, 3) if drafted else None, "outputs": outputs,
    }  # fmt: skip


def gateway_child(args: dict[str, Any]) -> dict[str, Any]:
    """One start (and with args["decode"], the measurements on it); prints its JSON. The
    var dir keeps what the gateway keeps between starts (verified weights, forward costs,
    lean parity, linear verdicts), as serving/__init__.py sets them."""
    t_start = time.perf_counter()
    import asyncio

    from gateway.serving.cost_store import CostStore
    from gateway.serving.models import ModelPool, PoolOptions
    from gateway.serving.worker import batch_rows
    from gateway.speed import keep_verdicts
    from gateway.speed.kept_parity import KeptParity

    imports = time.perf_counter() - t_start
    set_threads()
    rss_imports = _rss()["rss"]
    folder, var = Path(args["folder"]), Path(args["var"])
    cpu_linear = args["cpu_linear"]
    keep_verdicts(var / "linear-verdicts.json" if cpu_linear is None else None)  # as the gateway
    parts: dict[str, float] = {}
    _instrument(parts)

    async def runner(fn: Any) -> Any:
        return fn()

    async def start() -> tuple[Any, dict[str, Any]]:
        options = PoolOptions(
            device="cpu", dtype=args["dtype"], probe_rows=ROWS, cpu_linear=cpu_linear,
            compile_rows=lambda ctx: batch_rows(ROWS, None, ctx),
        )  # fmt: skip
        pool = ModelPool.from_manifest(str(folder / "manifest.yaml"), runner, options)
        pool.verified = var / "verified-weights.json"
        pool.costs = CostStore(var / "forward-costs.json")
        pool.parity = KeptParity(var / "lean-parity.json")
        t0 = time.perf_counter()
        await pool.load_targets()
        ready = time.perf_counter() - t0
        target_parts, rss_ready = dict(parts), _rss()
        parts.clear()
        name = pool.target_names()[0]
        t0 = time.perf_counter()
        await pool.draft(name, "1")
        draft_s = time.perf_counter() - t0
        out = {
            "imports_s": round(imports, 2), "ready_s": round(ready, 2), "rss_imports": rss_imports,
            "ready_from_process_start_s": round(imports + ready, 2),
            "target_parts_s": {k: round(v, 2) for k, v in target_parts.items()},
            "draft_first_use_s": round(draft_s, 2),
            "draft_parts_s": {k: round(v, 2) for k, v in parts.items()},
            "rss_ready": rss_ready, "rss_draft_loaded": _rss(),
        }  # fmt: skip
        return pool, out

    pool, out = asyncio.run(start())
    if args.get("decode"):
        out.update(_measure(pool, args))
    return out


def _measure(pool: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Memory, then standard, speculative and HF `generate` tokens/s on the started pool:
    per client count, ROUNDS rounds of the three, their order reversed every other round
    (load from elsewhere on the machine hits them alike), the same process, threads and
    weights (generate runs the target's own transformers model, with torch's linear forward
    while it runs), each warmed up first; the median round's rate is reported."""
    import asyncio
    import statistics

    import torch

    name = pool.target_names()[0]
    _, engine = asyncio.run(pool.target(name))
    draft = pool.loaded_draft_models(name)["1"]
    weights = {id(p): p.numel() * p.element_size() for m in (engine.target, draft)
               for p in m.model.parameters()}  # fmt: skip
    heads = {id(b): b.numel() * b.element_size() for m in (engine.target, draft)
             if m.draft_head is not None for b in m.draft_head.buffers()}  # fmt: skip
    out: dict[str, Any] = {
        "weight_bytes": sum(weights.values()) + sum(heads.values()),
        "draft_head_bytes": sum(heads.values()),
        "linear_form": _linear_form(engine.target),
    }
    prompts = [tuple(p) for p in args["prompts"]]
    batch = engine.batch(ROWS)
    configs = ("standard", "speculative", "hf_generate")

    def once(config: str, work: list[tuple[int, ...]], clients: int, n: int) -> dict[str, Any]:
        if config == "hf_generate":
            return _generate(engine.target.model, work, clients, n)
        spec = config == "speculative"
        return _decode(engine, batch, work, spec, draft, clients, n)

    with torch.inference_mode():
        for config in configs:  # warm-up: the batch's and the draft's KV slots, generate
            once(config, prompts[:1], 1, 4)
    kv = sum(b.nbytes for c in [batch.cache, *(d.cache for d in batch.drafts.values())]
             for bufs in c.buffers() for b in bufs)  # fmt: skip
    out.update(kv_bytes=kv, rss_kv_allocated=_rss(), packs=_packs())
    runs: dict[str, Any] = {}
    for clients in args["clients"]:
        work = prompts[: args["one_client"]] if clients == 1 else prompts[:clients]
        rounds: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
        for r in range(args.get("rounds", ROUNDS)):
            for config in configs if r % 2 == 0 else configs[::-1]:
                with torch.inference_mode():
                    got = once(config, work, clients, args["new_tokens"])
                rounds[config].append(got)
                print(f"      {config}_{clients} round {r}: {got['tokens_per_s']} tokens/s",
                      file=sys.stderr, flush=True)  # fmt: skip
        for config, done in rounds.items():
            rates = [g["tokens_per_s"] for g in done]
            mid = done[rates.index(statistics.median_low(rates))]
            runs[f"{config}_{clients}"] = {**mid, "rounds_tokens_per_s": rates}
    out.update(runs=runs, rss_end=_rss(), packs_end=_packs(), load_average=os.getloadavg())
    return out


ROUNDS = 3


def _packs() -> dict[str, int]:
    """The packed copies of weights the weight-major form holds (speed/packed_linear.py)."""
    from gateway.speed import packed_linear

    return {"kept": packed_linear.KERNEL.packs_kept(), "made": packed_linear.KERNEL.packs_made()}


def _generate(model: Any, work: list[tuple[int, ...]], clients: int, n: int) -> dict[str, Any]:
    """Greedy `generate` on `model` as transformers runs it: its linear layers' own forward
    for the time (the weight-major form is an instance attribute, speed/cpu_linear.py)."""
    import torch

    patched = {m: m.__dict__.pop("forward") for m in model.modules()
               if type(m) is torch.nn.Linear and "forward" in m.__dict__}  # fmt: skip
    try:
        t0 = time.perf_counter()
        batches = [[list(p) for p in work[i : i + clients]] for i in range(0, len(work), clients)]
        outputs = [o for batch in batches for o in hf_generate(model, batch, n)]
        wall = time.perf_counter() - t0
    finally:
        for m, forward in patched.items():
            m.forward = forward  # type: ignore[method-assign]
    tokens = sum(len(o) for o in outputs)
    return {
        "tokens": tokens, "seconds": round(wall, 2), "tokens_per_s": round(tokens / wall, 2),
        "acceptance": None, "outputs": outputs,
    }  # fmt: skip


def hf_generate(model: Any, batch: list[list[int]], tokens: int) -> list[list[int]]:
    """Greedy `generate` of exactly `tokens` tokens for each prompt, left-padded."""
    import torch

    width = max(len(p) for p in batch)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=tokens,
            min_new_tokens=tokens, do_sample=False, pad_token_id=0,
        )  # fmt: skip
    return [row[width:].tolist() for row in out]


def _linear_form(model: Any) -> str:
    from gateway.speed.cpu_linear import uses_weight_major

    if model.dtype != __import__("torch").float32:
        return "torch (not fp32)"
    return "weight-major" if uses_weight_major(model.model) else "torch"


def hf_child(args: dict[str, Any]) -> dict[str, Any]:
    """The target as transformers loads it, in a process of its own: its load time and its
    resident memory after a greedy `generate` (the speed is compared in the gateway's
    process, `_measure`)."""
    import torch
    from transformers import AutoModelForCausalLM

    set_threads()
    path = Path(args["folder"]) / "target"
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=args["dtype"])
    load = time.perf_counter() - t0
    model.eval()
    with torch.inference_mode():
        hf_generate(model, args["prompts"][:1], 4)
    return {"load_s": round(load, 2), "rss_end": _rss(), "load_average": os.getloadavg()}


def set_threads() -> None:
    """REALISTIC_THREADS=n: torch's intra-op threads, as GATEWAY_TORCH_THREADS sets them
    (default: torch's, the physical cores)."""
    if os.environ.get("REALISTIC_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["REALISTIC_THREADS"]))


def torch_threads() -> int:
    import torch

    set_threads()
    return torch.get_num_threads()
