"""``python -m models_registry heads ...``: train a draft head for a target.

python -m models_registry heads train --target DIR --data FILE --out DIR [options]
python -m models_registry heads generate --target DIR --data FILE --out FILE.jsonl [options]
python -m models_registry heads eval --target DIR --head DIR --data FILE [options]
python -m models_registry heads corpus --out FILE.jsonl [--held-out]   (the demo's data:
    the training (or held-out) split of models_registry/demo/corpus.py, one file a line)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from models_registry.heads.train import TrainArgs, train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m models_registry heads")
    cmds = parser.add_subparsers(dest="command", required=True)
    t = cmds.add_parser("train", help="train (or resume) a head")
    t.add_argument("--target", type=Path, required=True, help="the target's model directory")
    t.add_argument(
        "--data", type=Path, nargs="+", required=True,
        help=".txt or .jsonl (text / prompt); several: each an equal share of every batch",
    )  # fmt: skip
    t.add_argument("--out", type=Path, required=True, help="where the finished head goes")
    t.add_argument("--work", type=Path, default=None, help="checkpoints (default: OUT.work)")
    t.add_argument("--steps", type=int, default=600)
    t.add_argument("--minutes", type=float, default=20.0, help="stop and checkpoint after")
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--seq", type=int, default=256)
    t.add_argument("--ttt", type=int, default=3, help="training-time test steps (1: plain)")
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--vocab", type=Path, default=None, help="a draft_vocab.json to draft in")
    t.add_argument("--save-every", type=int, default=50)
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--chunk", type=int, default=None, help="stop after N steps this run")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    e = cmds.add_parser("eval", help="a head's chain acceptance on the target's own text")
    e.add_argument("--target", type=Path, required=True)
    e.add_argument(
        "--head", type=Path, nargs="+", required=True, help="head directories (compared)"
    )
    e.add_argument("--data", type=Path, required=True, help="prompts: .txt or .jsonl")
    e.add_argument("--prompts", type=int, default=32)
    e.add_argument("--prompt-tokens", type=int, default=64)
    e.add_argument("--new", type=int, default=128, help="greedy tokens per prompt")
    e.add_argument("--depth", type=int, default=8, help="chain length drafted")
    e.add_argument("--k", type=int, nargs="+", default=[4, 8, 16], help="tau at these k")
    e.add_argument("--seed", type=int, default=1)
    e.add_argument("--full-vocab", action="store_true", help="ignore the head's vocabulary")
    g = cmds.add_parser("generate", help="the target's greedy continuations of prompts")
    g.add_argument("--target", type=Path, required=True)
    g.add_argument("--data", type=Path, required=True, help="prompts from: .txt or .jsonl")
    g.add_argument("--out", type=Path, required=True, help="a .jsonl (appended to: resumes)")
    g.add_argument("--prompts", type=int, default=1024)
    g.add_argument("--prompt-tokens", type=int, default=64)
    g.add_argument("--new", type=int, default=192, help="greedy tokens per prompt")
    g.add_argument("--batch", type=int, default=32)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--threads", type=int, default=None)
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    c = cmds.add_parser("corpus", help="write the demo's training data")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--held-out", action="store_true", help="the held-out split instead")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "corpus":
        from models_registry.demo.corpus import load_corpus

        train_files, held_out = load_corpus()
        files = held_out if args.held_out else train_files
        with args.out.open("w", encoding="utf-8") as f:
            for item in files:
                f.write(json.dumps({"text": item.text}) + "\n")
        print(f"{len(files)} files -> {args.out}")
        return 0
    if args.command == "generate":
        from models_registry.heads.generate import generate

        if args.threads:
            torch.set_num_threads(args.threads)
        result = generate(args, progress=not args.quiet)
        print(json.dumps(result))
        return 0
    if args.command == "eval":
        from models_registry.heads.evaluate import main_eval

        return main_eval(args)
    for flag, value in (("--steps", args.steps), ("--batch", args.batch), ("--seq", args.seq),
                        ("--ttt", args.ttt)):  # fmt: skip
        if value < 1:
            print(f"error: {flag} must be >= 1", file=sys.stderr)
            return 2
    work = args.work or args.out.with_name(args.out.name + ".work")
    a = TrainArgs(
        target=args.target, data=tuple(args.data), out=args.out, work=work, steps=args.steps,
        minutes=args.minutes, batch=args.batch, seq=args.seq, ttt=args.ttt, lr=args.lr,
        seed=args.seed, vocab=args.vocab, save_every=args.save_every, threads=args.threads,
        chunk=args.chunk,
    )  # fmt: skip
    result = train(a, progress=not args.quiet)
    print(json.dumps(result))
    return 0
