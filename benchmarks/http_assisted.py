"""The gateway over HTTP against Hugging Face assisted generation, the same k, either draft.

    python -m benchmarks http_assisted [--quick]

What a user would otherwise run: transformers' `generate(assistant_model=...)` in a
process of their own, stock models (`from_pretrained`, the drafts with their full output
head: HF has no reduced head), exactly k = 4 drafted tokens a step (constant schedule, no
confidence cut). Against it: a real gateway process (uvicorn, SQLite audit) on the demo
target with that draft as its only one, one client, `decoding: {mode: speculative,
proposer: draft, k: 4}`, greedy, 96 new tokens, non-streamed, on the code prompts.

Both processes stay up and take turns prompt by prompt (HF, then HTTP, then the next
prompt: one of them works at a time), so a drift of the machine's speed hits both. HF is
given the token ids the gateway's tokenizer makes of the prompt. tokens/s = generated
tokens / wall seconds (the client's, for HTTP). Goal (issue 20): HTTP >= 1.3x HF.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks._server import gateway
from benchmarks.http import MODEL, _manifest, _prompts

ROOT = Path(__file__).resolve().parent.parent
NEW_TOKENS = 96
K = 4
GOAL = 1.3

CHILD = """
import json, sys, time, torch
from transformers import AutoModelForCausalLM
from gateway.engine import init_torch_thread
init_torch_thread()
target_dir, draft_dir, k, new = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
load = lambda p: AutoModelForCausalLM.from_pretrained(p, local_files_only=True,
                                                      dtype=torch.float32).eval()
target, draft = load(target_dir), load(draft_dir)
gc = draft.generation_config  # transformers reads these from the assistant's config
gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = k, "constant"
gc.assistant_confidence_threshold = 0.0
eos = target.generation_config.eos_token_id
eos = eos[0] if isinstance(eos, list) else eos
print("ready", flush=True)
for line in sys.stdin:
    ids = torch.tensor([json.loads(line)])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                              max_new_tokens=new, do_sample=False, num_assistant_tokens=k,
                              num_assistant_tokens_schedule="constant",
                              assistant_confidence_threshold=0.0, pad_token_id=eos)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "ids": out[0, ids.shape[1]:].tolist()}), flush=True)
"""


def _pair(folder: Path, version: str) -> tuple[Path, Path, Path]:
    """A manifest with the demo target and draft `version` only (http._manifest); its
    target's and draft's model dirs."""
    path = _manifest(folder, version)
    models = yaml.safe_load(path.read_text())["models"]
    target = next(Path(m["path"]) for m in models if m["role"] == "target")
    draft = next(Path(m["path"]) for m in models if m["role"] != "target")
    return path, target, draft


def _side_by_side(version: str, prompts: list[str]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        manifest, target_dir, draft_dir = _pair(Path(tmp), version)
        tok = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
        hf = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(target_dir), str(draft_dir), str(K),
             str(NEW_TOKENS)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert hf.stdin is not None and hf.stdout is not None
        try:
            if hf.stdout.readline().strip() != "ready":
                raise RuntimeError("the HF process did not start")
            with (
                gateway(GATEWAY_MODELS=str(manifest)) as gw,
                httpx.Client(base_url=gw.url, timeout=600) as client,
            ):
                key = gw.tenant("bench", {"client_override": {"allow": True}})
                headers = {"authorization": f"Bearer {key}"}
                decoding = {"mode": "speculative", "proposer": "draft", "k": K}
                body = {"model": MODEL, "max_tokens": NEW_TOKENS, "temperature": 0,
                        "decoding": decoding}  # fmt: skip

                def over_http(prompt: str) -> tuple[float, int, str, str | None]:
                    t0 = time.perf_counter()
                    r = client.post("/v1/completions", json={**body, "prompt": prompt},
                                    headers=headers)  # fmt: skip
                    r.raise_for_status()
                    got = r.json()
                    return (time.perf_counter() - t0, int(got["usage"]["completion_tokens"]),
                            got["choices"][0]["text"], r.headers.get("x-draft-model"))  # fmt: skip

                def in_hf(prompt: str) -> tuple[float, int, str]:
                    hf.stdin.write(json.dumps(tok(prompt)["input_ids"]) + "\n")  # type: ignore[union-attr]
                    hf.stdin.flush()  # type: ignore[union-attr]
                    got = json.loads(hf.stdout.readline())  # type: ignore[union-attr]
                    ids = [i for i in got["ids"] if i != tok.eos_token_id]
                    return got["seconds"], len(got["ids"]), tok.decode(ids)

                over_http(prompts[0])  # warm-up: the draft loads on first use
                in_hf(prompts[0])
                rows = []
                for p in prompts:
                    hs, hn, htext = in_hf(p)
                    gs, gn, gtext, draft = over_http(p)
                    rows.append({"hf_s": hs, "hf_tokens": hn, "http_s": gs, "http_tokens": gn,
                                 "same_text": htext == gtext, "draft": draft})  # fmt: skip
        finally:
            hf.kill()
    hf_tps = sum(r["hf_tokens"] for r in rows) / sum(r["hf_s"] for r in rows)
    http_tps = sum(r["http_tokens"] for r in rows) / sum(r["http_s"] for r in rows)
    return {
        "hf_assisted_tokens_per_s": round(hf_tps, 1),
        "http_tokens_per_s": round(http_tps, 1),
        "http_over_hf": round(http_tps / hf_tps, 3),
        "same_text": f"{sum(r['same_text'] for r in rows)}/{len(rows)}",
        "gateway_draft": sorted({str(r["draft"]) for r in rows}),
        "prompts": len(rows),
    }


def run(out_dir: Path, quick: bool = False) -> dict[str, Any]:
    prompts = _prompts(quick)
    result: dict[str, Any] = {
        "setup": {
            "k": K,
            "new_tokens": NEW_TOKENS,
            "greedy": True,
            "clients": 1,
            "sides": "gateway over HTTP vs HF generate(assistant_model) in its own "
            "process, both up, taking turns prompt by prompt",
        },
    }
    for version in ("1", "2"):
        result[f"draft_v{version}"] = _side_by_side(version, prompts)
        print(f"   draft v{version}: {result[f'draft_v{version}']}", flush=True)
    result["goal_http_over_hf"] = GOAL
    result["met"] = all(result[f"draft_v{v}"]["http_over_hf"] >= GOAL for v in ("1", "2"))
    return result
