"""Tiny model directories: config.json, tokenizer.json (built with `tokenizers`) and a
model.safetensors written by safetensors.torch, so nothing is downloaded or trained."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

BASE_VOCAB = ["<|endoftext|>", "def", "return", "(", ")", ":", "self", "import", "x", "y"]

MakeModel = Callable[..., Path]


def write_model(
    path: Path,
    vocab: list[str] | None = None,
    layers: int = 1,
    hidden: int = 8,
    seed: int = 0,
    config_vocab: int | None = None,
) -> Path:
    vocab = list(BASE_VOCAB if vocab is None else vocab)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token=vocab[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    width = len(vocab) if config_vocab is None else config_vocab
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "vocab_size": width,
    }
    (path / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(seed)
    tensors = {"model.embed_tokens.weight": torch.randn(width, hidden, generator=g)}
    for i in range(layers):
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(
            2 * hidden, hidden, generator=g
        )
    save_file({k: v.to(torch.float16) for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path
