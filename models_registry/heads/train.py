"""Training a feature-conditioned draft head for a target (gateway/feature_head.py).

    python -m models_registry heads train --target DIR --data FILE [FILE ...] --out DIR
        [--work DIR] [--steps N] [--minutes M] [--batch B] [--seq T] [--ttt S] [--seed S]
        [--vocab draft_vocab.json] [--chunk N]

Data: a text file (.txt, one document, or documents separated by blank-line-free EOS
strings), or JSON lines with "text" (or "prompt" and "completion", joined): prompts, code,
or the target's own generations. Each document is tokenized with the target's tokenizer
and EOS appended; batches are random windows of `seq` tokens, drawn from a generator seeded
by (seed, step), so a resumed run draws what an uninterrupted one would. Several data files
each give an equal share of every batch (a corpus and the target's own continuations of
it: `heads generate`).

Each step: one target forward without gradient (its hidden states at the head's taps and
its logits), then the head's loss with training-time test (ttt.py) against the target's
next-token distribution (distillation: what the verifier accepts is the target's choice).
Checkpoints (head, optimizer, step) go to --work every --save-every steps and when the
--minutes budget (or --chunk steps) runs out; a run with the same --work resumes there and
draws the batches an uninterrupted run would (the learning-rate schedule follows --steps).
At --steps the head is written to --out (head_config.json, head.safetensors,
draft_vocab.json if reduced, train_log.json).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gateway.feature_head import VOCAB_FILE, FeatureHead, HeadConfig, init_from_target, save_head
from models_registry.heads.ttt import ttt_loss

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class TrainArgs:
    target: Path
    data: tuple[Path, ...]  # each file an equal share of every batch's windows
    out: Path
    work: Path
    steps: int = 600
    minutes: float = 20.0
    batch: int = 8
    seq: int = 256
    ttt: int = 3
    lr: float = 2e-3
    seed: int = 0
    vocab: Path | None = None
    save_every: int = 50
    threads: int | None = None
    chunk: int | None = None  # stop (checkpointed) after this many steps in this run


def read_texts(path: Path) -> list[str]:
    """The data file's documents (see the module doc)."""
    raw = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return [raw]
    out = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        text = item.get("text")
        if text is None:
            text = str(item.get("prompt", "")) + str(item.get("completion", ""))
        out.append(str(text))
    if not out:
        raise ValueError(f"{path}: no documents")
    return out


def encode(tokenizer: Any, texts: list[str]) -> np.ndarray:
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(int(eos))
    return np.asarray(ids, dtype=np.int64)


def _encoded(tokenizer: Any, data: Path, work: Path) -> np.ndarray:
    """A data file's token ids, kept in the work directory after the first run (keyed by
    the file's size and time, so a changed file is encoded again)."""
    st = data.stat()
    cached = work / f"data-{st.st_size}-{int(st.st_mtime)}.npy"
    if cached.exists():
        return np.load(cached)
    ids = encode(tokenizer, read_texts(data))
    np.save(cached, ids)
    return ids


def batch_at(data: list[np.ndarray], step: int, seed: int, batch: int, seq: int) -> torch.Tensor:
    """The step's windows (batch, seq), the same for the same (seed, step): file i of
    `data` gives batch // len(data) of them (the first files one more for a remainder)."""
    rng = np.random.default_rng([seed, step])
    rows: list[np.ndarray] = []
    for i, ids in enumerate(data):
        if len(ids) <= seq:
            raise ValueError(f"the data has {len(ids)} tokens, fewer than one window of {seq}")
        share = batch // len(data) + (1 if i < batch % len(data) else 0)
        starts = rng.integers(0, len(ids) - seq, size=share)
        rows.extend(ids[s : s + seq] for s in starts)
    return torch.from_numpy(np.stack(rows))


def target_pass(
    target: Any, cfg: HeadConfig, x: torch.Tensor, vocab_ids: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features of positions 0..T-2, the tokens after them, the teacher's probabilities)."""
    with torch.no_grad():
        res = target(input_ids=x, output_hidden_states=True, use_cache=False)
        hs = res.hidden_states
        feats = torch.cat([hs[i] for i in cfg.taps], dim=-1)[:, :-1]  # (B, T-1, taps H)
        probs = torch.softmax(res.logits[:, 1:].float(), dim=-1)  # (B, T-1, V)
        if vocab_ids is not None:
            probs = probs[..., vocab_ids]
    return feats, x[:, 1:], probs


def lr_at(step: int, total: int, peak: float) -> float:
    warm = max(1, total // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def train(a: TrainArgs, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) until --steps or the --minutes budget; returns what was done."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(str(a.target), local_files_only=True)
    target = AutoModelForCausalLM.from_pretrained(
        str(a.target), local_files_only=True, dtype=torch.float32
    ).eval()
    target.requires_grad_(False)
    cfg = HeadConfig.for_target(target.config)
    embed = target.get_input_embeddings().weight
    out = target.get_output_embeddings().weight
    ids_t = None
    if a.vocab is not None:
        ids_t = torch.tensor(sorted(set(json.loads(a.vocab.read_text())["token_ids"])))
    head = FeatureHead(cfg, embed, out if ids_t is None else out[ids_t], ids_t)
    init_from_target(head, target)
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    a.work.mkdir(parents=True, exist_ok=True)
    ckpt = a.work / CHECKPOINT
    step, log, spent = 0, [], 0.0  # spent: training seconds of the earlier runs
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        step, log = int(state["step"]), list(state["log"])
        spent = float(state.get("seconds", 0.0))
    data = [_encoded(tok, path, a.work) for path in a.data]
    t0 = time.monotonic()
    bar = tqdm(total=a.steps, initial=step, disable=not progress, desc="head", unit="step")

    def save() -> None:
        seconds = spent + time.monotonic() - t0
        state = {"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "log": log,
                 "seconds": seconds}  # fmt: skip
        torch.save(state, a.work / (CHECKPOINT + ".tmp"))
        (a.work / (CHECKPOINT + ".tmp")).replace(ckpt)

    stop = a.steps if a.chunk is None else min(a.steps, step + a.chunk)
    while step < stop and time.monotonic() - t0 < a.minutes * 60:
        x = batch_at(data, step, a.seed, a.batch, a.seq)
        feats, tokens, teacher = target_pass(target, cfg, x, ids_t)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, a.steps, a.lr)
        loss, agree = ttt_loss(head, feats, tokens, teacher, a.ttt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        log.append(
            {
                "step": step,
                "loss": round(float(loss.detach()), 4),
                "agree": [round(v, 3) for v in agree],
            }
        )
        bar.update(1)
        bar.set_postfix(loss=f"{log[-1]['loss']:.3f}", agree=f"{agree[0]:.2f}")
        if step % a.save_every == 0:
            save()
    bar.close()
    save()
    done = step >= a.steps
    if done:
        save_head(head, a.out)
        if a.vocab is not None:
            shutil.copyfile(a.vocab, a.out / VOCAB_FILE)
        tail = log[-20:]
        summary = {
            "steps": step, "batch": a.batch, "seq": a.seq, "ttt": a.ttt, "lr": a.lr,
            "seed": a.seed, "tokens_seen": step * a.batch * a.seq,
            "last_loss": round(float(np.mean([r["loss"] for r in tail])), 4),
            "last_agree": [round(float(np.mean([r["agree"][i] for r in tail])), 3)
                           for i in range(a.ttt)],
            "data": [path.name for path in a.data],
            "train_seconds": round(spent + time.monotonic() - t0, 1),
        }  # fmt: skip
        (a.out / "train_log.json").write_text(json.dumps(summary, indent=2) + "\n")
    return {"step": step, "done": done, "seconds": round(time.monotonic() - t0, 1)}
