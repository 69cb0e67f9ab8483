"""Draft vocabularies: the N most frequent training tokens, written as draft_vocab.json
into each draft's directory (the engine then drafts among those tokens only, which makes a
draft step cheaper; see gateway/engine/draft_head.py).

    python -m models_registry.demo.draft_vocab [--size 3072] [--dir models_registry/demo]

The export stage of the training recipe calls write() too; this entry point adds the files
to already exported models (it tokenizes the training split with their tokenizer).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from models_registry.demo.corpus import encode, load_corpus

DEFAULT_SIZE = 3072
FILE = "draft_vocab.json"


def rank(data: np.ndarray, vocab: int, size: int, always: list[int]) -> dict:
    """The `size` most frequent ids of `data` (plus `always`, e.g. EOS), and their share."""
    counts = np.bincount(data, minlength=vocab)
    top = [int(i) for i in np.argsort(-counts, kind="stable")[:size]]
    ids = sorted(set(top) | set(always))
    return {
        "token_ids": ids,
        "size": len(ids),
        "training_token_coverage": round(float(counts[ids].sum() / counts.sum()), 4),
        "ranked_by": "token frequency in the training split",
    }


def write(model_dir: Path, vocab: dict) -> None:
    (model_dir / FILE).write_text(json.dumps(vocab) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", type=int, default=DEFAULT_SIZE)
    ap.add_argument("--dir", type=Path, default=Path("models_registry/demo"))
    args = ap.parse_args()
    drafts = sorted(p for p in args.dir.glob("demo-code-draft-v*") if p.is_dir())

    tok = PreTrainedTokenizerFast.from_pretrained(drafts[0], local_files_only=True)
    train, _ = load_corpus()
    data = encode(tok, [f.text for f in train])
    vocab = rank(data, len(tok), args.size, [int(tok.eos_token_id)])
    for d in drafts:
        write(d, vocab)
        print(f"{d / FILE}: {vocab['size']} ids, {vocab['training_token_coverage']:.1%} of tokens")


if __name__ == "__main__":
    main()
