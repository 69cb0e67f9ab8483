"""Tiny random models and a tiny byte-level BPE tokenizer for the engine and speed tests,
saved to disk and loaded back (so loading is tested too); the session fixtures are
re-exported by tests/unit/engine/conftest.py and tests/unit/speed/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from gateway.engine import LoadedModel
from gateway.speed import load_fast

torch.set_num_threads(1)

EOS = "<eos>"
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def sub(a, b):\n    return a - b\n",
    "for i in range(10):\n    print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "héllo wörld ça va — naïve café 日本語\n",
    "if x is None:\n    return None\nelse:\n    return x\n",
]
CONTEXT = 96


def build_tokenizer(vocab_size: int = 300, special: str = EOS) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=special, pad_token=special)


def llama(vocab: int, eos: int, seed: int, layers: int = 2, hidden: int = 32, init: float = 0.1):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        initializer_range=init,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    return LlamaForCausalLM(cfg)


def gpt2(vocab: int, eos: int, seed: int, layers: int = 2, hidden: int = 32, init: float = 0.1):
    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=vocab,
        n_embd=hidden,
        n_layer=layers,
        n_head=4,
        n_positions=CONTEXT,
        initializer_range=init,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    return GPT2LMHeadModel(cfg)


def save(model, tok, path: Path) -> Path:
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    return {
        "llama": save(llama(vocab, eos, seed=1), tokenizer, root / "llama"),
        "gpt2": save(gpt2(vocab, eos, seed=2), tokenizer, root / "gpt2"),
        "draft": save(llama(vocab, eos, seed=3, layers=1), tokenizer, root / "draft"),
    }


@pytest.fixture(scope="session")
def llama_lm(model_dirs) -> LoadedModel:
    return load_fast(
        model_dirs["llama"], device="cpu", cpu_linear=True
    )  # the path with its own rounding


@pytest.fixture(scope="session")
def gpt2_lm(model_dirs) -> LoadedModel:
    return load_fast(model_dirs["gpt2"], device="cpu", cpu_linear=True)


@pytest.fixture(scope="session")
def draft_lm(model_dirs) -> LoadedModel:
    return load_fast(model_dirs["draft"], device="cpu", cpu_linear=True)
