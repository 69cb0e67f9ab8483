"""How well a head drafts for its target, offline: on the target's own greedy continuations
of prompts, the chain acceptance a greedy verifier would give at each depth.

    python -m models_registry heads eval --target DIR --head DIR [DIR ...] --data FILE
        [--prompts N] [--prompt-tokens P] [--new T] [--depth D] [--k K]

For each committed prefix of a continuation (the prompt and the first j generated tokens),
the head drafts a chain of `depth` tokens from the target's hidden states of that prefix
(ttt.unroll, which attends exactly as drafting does: the committed positions' keys, then
the chain's own); a drafted token counts when it is the target's greedy choice and every
one before it was. Reported: the acceptance at each depth given the depth before it was
accepted, the mean accepted length, and tau = tokens per target forward of a greedy
decode that drafts k tokens a step (walking each continuation as the engine would).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gateway.feature_head import FeatureHead
from models_registry.heads.ttt import unroll


@torch.no_grad()
def greedy_continue(target: Any, prompts: torch.Tensor, new: int) -> torch.Tensor:
    """(B, P) prompts -> (B, P + new): the target's greedy continuations (no stop)."""
    out = target(input_ids=prompts, use_cache=True)
    seqs = [prompts]
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    for i in range(new):
        seqs.append(nxt)
        if i == new - 1:
            break
        out = target(input_ids=nxt, cache=out.cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    return torch.cat(seqs, dim=1)


def prompt_windows(ids: np.ndarray, count: int, length: int, seed: int) -> torch.Tensor:
    """`count` windows of `length` tokens at seeded random places of `ids`."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(ids) - length, size=count)
    return torch.from_numpy(np.stack([ids[s : s + length] for s in starts]).astype(np.int64))


@torch.no_grad()
def accepted_lengths(
    head: FeatureHead, target: Any, seqs: torch.Tensor, first: int, depth: int
) -> torch.Tensor:
    """(B, S) accepted chain lengths (0..depth) for drafts from the committed prefixes
    seqs[:, : c + 1], c = first .. first + S - 1 (c: the last committed position): how
    many of the head's chain are the target's greedy tokens. `first` >= 1."""
    cfg = head.cfg
    res = target(input_ids=seqs, output_hidden_states=True, use_cache=False)
    feats = torch.cat([res.hidden_states[i] for i in cfg.taps], dim=-1)[:, :-1]
    feats = feats.to(head.fc.weight.dtype)
    best = res.logits[:, 1:].argmax(-1)  # best[:, p]: the target's choice after x_{p+1}
    tokens = seqs[:, 1:]  # position p reads x_{p+1}
    n = tokens.shape[1]
    # a draft after committed position c starts at head position p0 = c - 1 (it reads
    # x_c); step s at position p0 + s - 1 guesses best[:, p0 + s - 1]
    starts = torch.arange(first - 1, n - depth)
    run = torch.ones(seqs.shape[0], len(starts), dtype=torch.bool)
    length = torch.zeros(seqs.shape[0], len(starts), dtype=torch.long)
    for s, o in enumerate(unroll(head, feats, tokens, depth), start=1):
        guess = head.logits(o).argmax(-1)  # (B, n) in the head's vocabulary
        if head.out_ids is not None:
            guess = head.out_ids[guess]
        ok = (guess == best)[:, starts + s - 1]
        run &= ok
        length += run.long()
    return length


def summarize(lengths: torch.Tensor, depth: int, ks: tuple[int, ...]) -> dict[str, Any]:
    """Acceptance per depth, mean accepted length and tau for fixed k per step."""
    flat = lengths.flatten()
    alpha = []
    for s in range(1, depth + 1):
        reached = int((flat >= s - 1).sum())
        alpha.append(round(int((flat >= s).sum()) / max(reached, 1), 3))
    taus = {}
    for k in ks:
        tokens = forwards = 0
        for row in lengths.tolist():
            j = 0
            while j < len(row):
                got = min(row[j], k) + 1
                tokens += got
                forwards += 1
                j += got
        taus[str(k)] = round(tokens / max(forwards, 1), 3)
    return {
        "positions": int(flat.numel()),
        "acceptance_at_depth": alpha,
        "mean_accepted": round(float(flat.float().mean()), 3),
        "tau_at_k": taus,
    }


def evaluate(a: Any) -> dict[str, Any]:
    """Load the target and head, continue `a.prompts` windows of `a.data` greedily and
    report (see the module doc); `a`: the CLI's arguments."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gateway.feature_head import load_head
    from models_registry.heads.train import encode, read_texts

    tok = AutoTokenizer.from_pretrained(str(a.target), local_files_only=True)
    target = AutoModelForCausalLM.from_pretrained(
        str(a.target), local_files_only=True, dtype=torch.float32
    ).eval()
    m = target
    ids = encode(tok, read_texts(Path(a.data)))
    windows = prompt_windows(ids, a.prompts, a.prompt_tokens, a.seed)
    seqs = greedy_continue(target, windows, a.new)
    heads = {}
    for path in a.head:  # every head on the same continuations
        head = load_head(
            path, m.get_input_embeddings().weight, m.get_output_embeddings().weight,
            not a.full_vocab,
        )  # fmt: skip
        lengths = accepted_lengths(head, target, seqs, a.prompt_tokens, a.depth)
        heads[str(path)] = summarize(lengths, a.depth, tuple(a.k))
    return {"heads": heads, "data": Path(a.data).name, "prompts": a.prompts,
            "prompt_tokens": a.prompt_tokens, "new": a.new, "seed": a.seed}  # fmt: skip


def main_eval(args: Any) -> int:
    print(json.dumps(evaluate(args), indent=2))
    return 0
