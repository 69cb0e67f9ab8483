"""The demo corpus: this machine's Python standard library sources, split by file.

A file goes to the held-out split when the SHA-256 of its relative path falls in the
last 5% of the hash space, so the split is stable across machines with the same Python.
Tests and site-packages are left out.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HELD_OUT_PERCENT = 5
EXCLUDED_PARTS = {"test", "tests", "site-packages", "idle_test", "__pycache__"}


@dataclass(frozen=True)
class CorpusFile:
    relpath: str
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relpath: str) -> bool:
    digest = hashlib.sha256(relpath.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT


def load_corpus(root: Path | None = None) -> tuple[list[CorpusFile], list[CorpusFile]]:
    """Return (train, held_out) files, sorted by path for reproducibility."""
    root = root or stdlib_root()
    train: list[CorpusFile] = []
    held: list[CorpusFile] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_PARTS.intersection(rel.parts):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            continue
        item = CorpusFile(str(rel), text)
        (held if is_held_out(item.relpath) else train).append(item)
    return train, held


EOS = "<|endoftext|>"
"""The demo tokenizer's end of text, appended after each file by `encode`."""


def encode(tok: Any, texts: list[str]) -> np.ndarray:
    """The texts as one id array, EOS after each (the recipe's encoding)."""
    eos = int(tok.convert_tokens_to_ids(EOS))  # type: ignore[arg-type]
    ids: list[int] = []
    for enc in tok.backend_tokenizer.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)
