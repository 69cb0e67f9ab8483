"""The target's own greedy continuations of prompts, as a head's training data.

    python -m models_registry heads generate --target DIR --data FILE --out FILE.jsonl
        [--prompts N] [--prompt-tokens P] [--new T] [--batch B] [--seed S]

Prompts are `prompts` windows of `prompt-tokens` tokens drawn at seeded random places of
the data file (a .txt or .jsonl as `heads train` reads); each line of the output is
{"prompt": ..., "completion": ...}: the window's text and the target's greedy
continuation of it, `new` tokens, decoded. A head drafts what the target will say, so
training on what the target says (EAGLE-3 and SpecForge regenerate their data with the
target for the same reason) teaches it the states it will read when serving. Resumable:
lines already in --out are kept and the rest appended.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from models_registry.heads.evaluate import greedy_continue, prompt_windows


def generate(a: Any, progress: bool = True) -> dict[str, Any]:
    """`a`: the CLI's arguments (target, data, out, prompts, prompt_tokens, new, batch,
    seed)."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models_registry.heads.train import encode, read_texts

    target_dir, out = Path(a.target), Path(a.out)
    prompts, prompt_tokens = a.prompts, a.prompt_tokens
    tok = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
    target = AutoModelForCausalLM.from_pretrained(
        str(target_dir), local_files_only=True, dtype=torch.float32
    ).eval()
    ids = encode(tok, read_texts(Path(a.data)))
    windows = prompt_windows(ids, prompts, prompt_tokens, a.seed)
    done = 0
    if out.exists():
        done = sum(1 for line in out.read_text(encoding="utf-8").splitlines() if line.strip())
    bar = tqdm(total=prompts, initial=done, disable=not progress, desc="generate", unit="prompt")
    with out.open("a", encoding="utf-8") as f:
        for lo in range(done, prompts, a.batch):
            x = windows[lo : lo + a.batch]
            seqs = greedy_continue(target, x, a.new)
            for row in seqs.tolist():
                prompt = tok.decode(row[:prompt_tokens])
                completion = tok.decode(row[prompt_tokens:])
                f.write(json.dumps({"prompt": prompt, "completion": completion}) + "\n")
            f.flush()
            bar.update(len(x))
    bar.close()
    return {"prompts": prompts, "new_tokens": prompts * a.new, "out": str(out)}
