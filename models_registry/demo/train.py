"""Recipe for the bundled demo pair: tokenizer, target, draft v1, draft v2 (distilled).

    python -m models_registry.demo.train            # all stages, resumes where it stopped
    python -m models_registry.demo.train --init-from models_registry/demo --target-steps 1400 \
        --draft-steps 0 --distill-steps 300        # continue training the committed models

Stages write into a work folder (default var/demo-train/) and are skipped when their output
exists; model training checkpoints every `--ckpt-every` steps, so an interrupted run resumes
from its last checkpoint with the same data order (batches are drawn from a generator seeded
by (seed, step)). With `--init-from DIR` every model starts from DIR's exported weights
(and the tokenizer is DIR's, so token ids never change); 0 steps keeps a model as it is, and
metrics.json keeps the earlier phases' records. The export stage writes fp16 safetensors,
the manifest and metrics.json into models_registry/demo/. CPU only; never run by `make test`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from models_registry.demo import draft_vocab
from models_registry.demo.corpus import EOS, encode, load_corpus

SPECIALS = [EOS, "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (Path(__file__).parent / "chat_template.jinja").read_text()
"""ChatML with tool roles: tools in the system turn, calls as <tool_call> blocks (the syntax
gateway.engine.constraints.tool_calls forces), results as tool turns."""


@dataclass(frozen=True)
class Arch:
    layers: int
    hidden: int
    heads: int
    intermediate: int


TARGET = Arch(layers=12, hidden=256, heads=4, intermediate=768)
DRAFT = Arch(layers=1, hidden=192, heads=3, intermediate=512)


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


# 1. Tokenizer ------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=None, pad_token=EOS
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# 2. Models and batches ----------------------------------------------------------------------


def build_model(arch: Arch, vocab: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def batch_at(data: np.ndarray, seed: int, step: int, batch: int, seq: int) -> torch.Tensor:
    """The batch of `step`: a pure function of (seed, step), so resumption is exact."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g).tolist()
    rows = [torch.from_numpy(data[s : s + seq + 1].astype(np.int64)) for s in starts]
    return torch.stack(rows)  # (batch, seq + 1)


@dataclass
class TrainSpec:
    name: str
    steps: int
    batch: int
    seq: int
    lr: float
    seed: int
    warmup: int = 50


def lr_at(spec: TrainSpec, step: int) -> float:
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model: LlamaForCausalLM,
    data: np.ndarray,
    spec: TrainSpec,
    ckpt: Path,
    ckpt_every: int,
    teacher: LlamaForCausalLM | None = None,
    mix: np.ndarray | None = None,
) -> dict:
    """Next-token cross-entropy, or KL to `teacher`'s distribution when one is given.
    With `mix`, half of every batch is drawn from it instead of `data`."""
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.1, betas=(0.9, 0.95))
    step, seconds = 0, 0.0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, seconds = state["step"], state["seconds"]
        log(f"[{spec.name}] resumed at step {step}/{spec.steps}")
    model.train()
    t0, ema = time.time(), None
    while step < spec.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(spec, step)
        rows = batch_at(data, spec.seed, step, spec.batch, spec.seq)
        if mix is not None:
            half = spec.batch // 2
            rows[half:] = batch_at(mix, spec.seed + 7, step, spec.batch - half, spec.seq)
        x, y = rows[:, :-1], rows[:, 1:]
        logits = model(input_ids=x).logits  # (B, T, V)
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        else:
            with torch.no_grad():
                t_logp = F.log_softmax(teacher(input_ids=x).logits, dim=-1)  # (B, T, V)
            s_logp = F.log_softmax(logits, dim=-1)
            loss = F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean") / x.size(1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 10 == 0 or step == spec.steps:
            elapsed = seconds + time.time() - t0
            tps = step * spec.batch * spec.seq / max(elapsed, 1e-9)
            eta = (spec.steps - step) * elapsed / step
            log(
                f"[{spec.name}] step {step}/{spec.steps} loss {ema:.3f} "
                f"lr {lr_at(spec, step - 1):.2e} {tps:.0f} tok/s eta {eta / 60:.1f} min"
            )
        if step % ckpt_every == 0 or step == spec.steps:
            state = {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "seconds": seconds + time.time() - t0,
            }
            torch.save(state, ckpt.with_suffix(".tmp"))
            ckpt.with_suffix(".tmp").replace(ckpt)
    total = seconds + time.time() - t0
    return {
        "steps": spec.steps,
        "tokens_seen": spec.steps * spec.batch * spec.seq,
        "train_seconds": round(total, 1),
        "spec": asdict(spec),
    }


def init_weights(model: LlamaForCausalLM, init_from: Path | None, rel: str) -> bool:
    """Load DIR/rel's exported (fp16) weights into `model` as fp32; False without DIR."""
    if init_from is None:
        return False
    exported = LlamaForCausalLM.from_pretrained(init_from / rel, local_files_only=True)
    model.load_state_dict(exported.float().state_dict())
    log(f"[{rel}] initialised from {init_from / rel}")
    return True


def phase(previous: dict, name: str, new: dict) -> dict:
    """The record of `name` after one more training phase: the new phase's fields, the
    earlier phases under `phases`, and tokens / seconds / steps summed over all of them."""
    old = previous.get(name)
    if old is None:
        return new
    phases = [*old.get("phases", [{k: v for k, v in old.items() if k in new}]), new]
    return {
        **new,
        "steps": sum(ph["steps"] for ph in phases),
        "tokens_seen": sum(ph["tokens_seen"] for ph in phases),
        "train_seconds": round(sum(ph["train_seconds"] for ph in phases), 1),
        "phases": phases,
    }


# 3. Evaluation ----------------------------------------------------------------------------


@torch.no_grad()
def held_out_loss(model: LlamaForCausalLM, data: np.ndarray, seq: int = 256) -> float:
    model.eval()
    losses = []
    for start in range(0, min(len(data) - seq - 1, 200 * seq), seq):
        rows = torch.from_numpy(data[start : start + seq + 1].astype(np.int64))[None]
        logits = model(input_ids=rows[:, :-1]).logits
        losses.append(F.cross_entropy(logits[0], rows[0, 1:]).item())
    return float(np.mean(losses))


@torch.no_grad()
def greedy_agreement(target, drafts: dict, prompts: list[torch.Tensor], new: int) -> dict:
    """Share of positions where each draft's argmax equals the target's greedy token,
    along the target's own greedy continuation (what greedy speculation accepts)."""
    target.eval()
    hits = {name: 0 for name in drafts}
    total = 0
    for prompt in prompts:
        out = target.generate(
            prompt[None], max_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None
        )  # (1, P + new)
        n_prompt = prompt.numel()
        want = out[0, n_prompt:]
        for name, draft in drafts.items():
            draft.eval()
            pred = draft(input_ids=out[:, :-1]).logits[0, n_prompt - 1 :].argmax(-1)
            hits[name] += int((pred == want).sum())
        total += want.numel()
    return {name: round(h / total, 4) for name, h in hits.items()}


@torch.no_grad()
def step_ms(model: LlamaForCausalLM, context: int = 64, reps: int = 60) -> float:
    """Median time of one KV-cached single-token decode step."""
    model.eval()
    ids = torch.randint(10, 1000, (1, context))
    out = model(input_ids=ids, use_cache=True)
    cache, nxt = out.past_key_values, ids[:, -1:]
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - t)
        cache.crop(-1)
    return float(np.median(times) * 1000)


@torch.no_grad()
def target_continuations(
    target: LlamaForCausalLM, data: np.ndarray, tokens: int, seed: int, batch: int = 16
) -> np.ndarray:
    """`tokens` tokens of the target's own greedy continuations (64-token training windows as
    prompts, 192 new tokens each), flattened with EOS between sequences: what the draft sees
    at serving time, where it must predict the target's outputs, not the corpus."""
    target.eval()
    prompt_len, new = 64, 192
    out: list[np.ndarray] = []
    done, step = 0, 0
    t0 = time.time()
    while done < tokens:
        prompts = batch_at(data, seed, step, batch, prompt_len - 1)  # (B, 64)
        seqs = target.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )  # (B, 64 + new)
        for row in seqs.numpy().astype(np.uint16):
            out.append(np.append(row, np.uint16(0)))
        done += batch * new
        step += 1
        rate = done / max(time.time() - t0, 1e-9)
        log(f"[continuations] {done:,}/{tokens:,} tokens, {rate:.0f} tok/s")
    return np.concatenate(out)


def held_out_prompts(tok, held_texts: list[str], n: int, length: int) -> list[torch.Tensor]:
    prompts = []
    for text in held_texts:
        ids = tok(text)["input_ids"]
        if len(ids) >= length * 4:
            mid = len(ids) // 2
            prompts.append(torch.tensor(ids[mid - length : mid]))
        if len(prompts) == n:
            break
    return prompts


# 4. Export --------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def export(model, tok, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)
    tok.save_pretrained(out)
    return {
        "sha256": sha256_file(out / "model.safetensors"),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("var/demo-train"))
    ap.add_argument("--out", type=Path, default=Path("models_registry/demo"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--target-steps", type=int, default=900)
    ap.add_argument("--draft-steps", type=int, default=1200)
    ap.add_argument("--distill-steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--ckpt-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument(
        "--on-policy-tokens",
        type=int,
        default=0,
        help="distil draft v2 on this many tokens of the target's own greedy output (half of "
        "each batch) besides the corpus; 0 = corpus only",
    )
    ap.add_argument(
        "--draft-vocab",
        type=int,
        default=draft_vocab.DEFAULT_SIZE,
        help="write draft_vocab.json (the N most frequent training tokens) with each draft; 0 = "
        "none (drafts then use their full output head)",
    )
    ap.add_argument(
        "--init-from", type=Path, default=None, help="start every model from this export"
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.time()

    train_files, held_files = load_corpus()
    log(f"corpus: {len(train_files)} train files, {len(held_files)} held-out files")
    tok_dir = args.work / "tokenizer"
    init = args.init_from
    previous: dict = {}
    if init is not None:
        previous = json.loads((init / "metrics.json").read_text())
        if not (tok_dir / "tokenizer.json").exists():  # the same token ids as the old models
            PreTrainedTokenizerFast.from_pretrained(
                init / "demo-code-target-v1", local_files_only=True
            ).save_pretrained(tok_dir)
    if not (tok_dir / "tokenizer.json").exists():
        log("training tokenizer")
        train_tokenizer([f.text for f in train_files], args.vocab).save_pretrained(tok_dir)
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir, local_files_only=True)
    vocab = len(tok)

    data_path, held_path = args.work / "train.npy", args.work / "held.npy"
    if not data_path.exists():
        log("encoding corpus")
        np.save(data_path, encode(tok, [f.text for f in train_files]))
        np.save(held_path, encode(tok, [f.text for f in held_files]))
    data, held = np.load(data_path), np.load(held_path)
    log(f"tokens: train {len(data):,}, held-out {len(held):,}")

    report: dict = {
        "corpus": {
            "train_files": len(train_files),
            "held_out_files": len(held_files),
            "train_tokens": len(data),
            "held_out_tokens": len(held),
            "held_out_rule": "sha256(relative path) % 100 < 5",
        }
    }

    # A continued phase uses new batch seeds (+100) and a lower peak learning rate.
    again = 100 if init is not None else 0
    target = build_model(TARGET, vocab, args.seed)
    init_weights(target, init, "demo-code-target-v1")
    t_lr = 1e-3 if again else 2e-3
    t_spec = TrainSpec("target", args.target_steps, args.batch, args.seq, t_lr, args.seed + again)
    t_rec = train(target, data, t_spec, args.work / "target.pt", args.ckpt_every)
    keep_target = init is not None and t_spec.steps == 0
    report["target"] = previous["target"] if keep_target else phase(previous, "target", t_rec)
    target.eval().requires_grad_(False)

    draft_v1 = build_model(DRAFT, vocab, args.seed + 1)
    init_weights(draft_v1, init, "demo-code-draft-v1")
    d_spec = TrainSpec(
        "draft_v1", args.draft_steps, args.batch, args.seq, 3e-3, args.seed + 1 + again
    )
    d_rec = train(draft_v1, data, d_spec, args.work / "draft_v1.pt", args.ckpt_every)
    keep_v1 = init is not None and d_spec.steps == 0
    report["draft_v1"] = previous["draft_v1"] if keep_v1 else phase(previous, "draft_v1", d_rec)

    draft_v2 = build_model(DRAFT, vocab, args.seed + 1)
    if not init_weights(draft_v2, init, "demo-code-draft-v2"):
        draft_v2.load_state_dict(draft_v1.state_dict())  # start from v1, then distil
    v2_spec = TrainSpec(
        "draft_v2",
        args.distill_steps,
        args.batch,
        args.seq,
        1.5e-3,
        args.seed + 2 + again,
        warmup=20,
    )
    mix = None
    if args.on_policy_tokens > 0:
        mix_path = args.work / "continuations.npy"
        if not mix_path.exists():
            log("generating the target's greedy continuations for distillation")
            gen = target_continuations(target, data, args.on_policy_tokens, args.seed + 3)
            np.save(mix_path, gen)
        mix = np.load(mix_path)
    v2_rec = train(
        draft_v2, data, v2_spec, args.work / "draft_v2.pt", args.ckpt_every, teacher=target, mix=mix
    )
    report["draft_v2"] = phase(previous, "draft_v2", v2_rec)
    report["draft_v2"]["distilled_from"] = "target (KL to its next-token distribution)"
    if mix is not None:
        report["draft_v2"]["distilled_on"] = (
            f"half corpus windows, half the target's own greedy continuations "
            f"({len(mix):,} tokens: 64-token corpus prompts + 192 new tokens)"
        )

    log("evaluating")
    for name, m in (("target", target), ("draft_v1", draft_v1), ("draft_v2", draft_v2)):
        loss = held_out_loss(m, held)
        report[name].update(
            held_out_loss=round(loss, 4), held_out_perplexity=round(math.exp(loss), 2)
        )
        log(f"{name}: held-out loss {loss:.3f}, perplexity {math.exp(loss):.1f}")
    prompts = held_out_prompts(tok, [f.text for f in held_files], n=24, length=64)
    report["greedy_agreement"] = greedy_agreement(
        target, {"draft_v1": draft_v1, "draft_v2": draft_v2}, prompts, new=128
    )
    report["greedy_agreement_setup"] = f"{len(prompts)} held-out prompts x 64 tokens, 128 new"
    log(f"greedy agreement: {report['greedy_agreement']}")
    t_ms, d_ms = step_ms(target), step_ms(draft_v2)
    report["cost"] = {
        "target_step_ms": round(t_ms, 2),
        "draft_step_ms": round(d_ms, 2),
        "c": round(d_ms / t_ms, 3),
    }
    log(f"cost: target {t_ms:.1f} ms, draft {d_ms:.1f} ms, c = {d_ms / t_ms:.3f}")

    log("exporting")
    trained_on = "CPython 3.11 standard library sources, held-out split excluded"
    entries = []
    for name, version, role, m, arch in (
        ("demo-code-target", "1", "target", target, TARGET),
        ("demo-code-draft", "1", "draft", draft_v1, DRAFT),
        ("demo-code-draft", "2", "draft", draft_v2, DRAFT),
    ):
        rel = f"{name}-v{version}"
        info = export(m, tok, args.out / rel)
        entry = {
            "name": name,
            "version": version,
            "role": role,
            "path": rel,
            "sha256": info["sha256"],
            "architecture": "LlamaForCausalLM",
            "layers": arch.layers,
            "hidden": arch.hidden,
            "parameters": info["parameters"],
            "tokenizer": "demo-bpe-8k",
            "dtype": "float16",
            "trained_on": trained_on,
        }
        if role == "draft":
            entry["target"] = "demo-code-target"
            if args.draft_vocab > 0:
                ranked = draft_vocab.rank(data, vocab, args.draft_vocab, [int(tok.eos_token_id)])
                draft_vocab.write(args.out / rel, ranked)  # speed only: not in the manifest
        entries.append(entry)
    (args.out / "manifest.yaml").write_text(yaml.safe_dump({"models": entries}, sort_keys=False))
    report["total_seconds"] = round(time.time() - started, 1)
    (args.out / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"done in {report['total_seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
