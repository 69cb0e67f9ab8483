"""A tiny random target/draft pair with a ChatML tokenizer and a manifest, built on the fly
for integration tests (the bundled demo models are for `make run` and benchmarks)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    Path(__file__).parents[2] / "models_registry" / "demo" / "chat_template.jinja"
).read_text()
"""The demo models' ChatML template (with tool roles)."""
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    'import json\nprint(json.dumps({"a": 1, "b": [true, null]}))\n',
    "héllo wörld — naïve café\n",
]
CONTEXT = 256


def tokenizer(extra_tokens: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """The tiny BPE; ``extra_tokens`` are added as whole (non-special) tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=[EOS, "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.add_tokens(list(extra_tokens))
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _model(vocab: int, layers: int, seed: int, context: int = CONTEXT) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def _sha(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def build(root: Path, context: int = CONTEXT, extra_tokens: tuple[str, ...] = ()) -> Path:
    """Write target v1, drafts v1 (a copy of the target: always agrees) and v2 (random),
    and manifest.yaml under ``root``; return the manifest path."""
    tok = tokenizer(extra_tokens)
    vocab = len(tok)
    target = _model(vocab, layers=2, seed=1, context=context)
    entries = []
    for name, version, role, model in (
        ("tiny-target", "1", "target", target),
        ("tiny-draft", "1", "draft", target),
        ("tiny-draft", "2", "draft", _model(vocab, layers=1, seed=2, context=context)),
    ):
        path = root / f"{name}-v{version}"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        entry = {
            "name": name,
            "version": version,
            "role": role,
            "path": path.name,
            "sha256": _sha(path),
            "architecture": "LlamaForCausalLM",
        }
        if role == "draft":
            entry["target"] = "tiny-target"
        entries.append(entry)
    manifest = root / "manifest.yaml"
    manifest.write_text(yaml.safe_dump({"models": entries}, sort_keys=False))
    return manifest
