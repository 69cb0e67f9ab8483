"""Draft vocabularies: the most frequent training ids (plus the ones always kept), and the
shipped demo files are valid for the engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from models_registry.demo.draft_vocab import FILE, rank

DEMO = Path(__file__).resolve().parents[3] / "models_registry" / "demo"


def test_rank_keeps_the_most_frequent_ids_and_the_forced_ones() -> None:
    data = np.array([5, 5, 5, 2, 2, 7, 1, 1, 1, 1])
    vocab = rank(data, vocab=10, size=2, always=[0])
    assert vocab["token_ids"] == [0, 1, 5]  # 1 (x4) and 5 (x3), plus EOS id 0
    assert vocab["size"] == 3
    assert vocab["training_token_coverage"] == 0.7


def test_shipped_draft_vocabularies_fit_the_tokenizer() -> None:
    for draft in ("demo-code-draft-v1", "demo-code-draft-v2"):
        ids = json.loads((DEMO / draft / FILE).read_text())["token_ids"]
        tok = json.loads((DEMO / draft / "tokenizer.json").read_text())
        vocab = len(tok["model"]["vocab"])  # 8,192, the specials included
        assert ids == sorted(set(ids))
        assert ids[0] >= 0 and ids[-1] < vocab
        assert 0 in ids  # <|endoftext|> (id 0) stays draftable
