"""Tiny random models of every family transformers ships that users serve, shaped so that
each family's own per-layer rules matter: windows and chunks shorter than the prompts, the
families' rope scalings, soft-capping, attention sinks, mixtures of experts.

Each is built from its config class on the fly (no hub), with one tiny byte-level BPE
tokenizer shared by all, and wrapped as the gateway loads a model (`wrap_model`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

CONTEXT = 512  # every model's context length: room for prompts longer than the windows
WINDOW = 16  # sliding windows and chunks: far shorter than the prompts
EOS = "<eos>"
TEXT = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "SELECT name FROM users WHERE id = 3;\n",
]


@cache
def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(TEXT * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def _common(layers: int) -> dict[str, Any]:
    tok = tokenizer()
    eos = tok.eos_token_id
    return {
        "vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": CONTEXT, "bos_token_id": eos, "eos_token_id": eos,
        "pad_token_id": eos, "tie_word_embeddings": False,
    }  # fmt: skip


@dataclass(frozen=True)
class Family:
    """How to build one family's tiny model: its config and model class names in
    transformers and the config's arguments besides the common ones."""

    name: str
    config: str
    model: str
    extra: Callable[[], dict[str, Any]]
    layers: int = 2
    common: bool = True  # False: the config takes its own argument names (GPT-2)

    def build(self, seed: int = 0, init: float = 0.2) -> Any:
        torch.manual_seed(seed)
        args = _common(self.layers) if self.common else {}
        args |= {"initializer_range": init, **self.extra()}
        cfg = getattr(transformers, self.config)(**args)
        cfg._attn_implementation = "sdpa" if "sdpa" in _attn(self) else "eager"
        model = getattr(transformers, self.model)(cfg)
        return model.eval().requires_grad_(False)


def _attn(family: Family) -> str:
    cls = getattr(transformers, family.model)
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


def _gpt2() -> dict[str, Any]:
    tok = tokenizer()
    eos = tok.eos_token_id
    return {"vocab_size": len(tok), "n_embd": 64, "n_layer": 2, "n_head": 4,
            "n_positions": CONTEXT, "bos_token_id": eos, "eos_token_id": eos}  # fmt: skip


def _llama3_rope() -> dict[str, Any]:
    return {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
    }}  # fmt: skip


FAMILIES = [
    Family("llama3", "LlamaConfig", "LlamaForCausalLM", _llama3_rope),
    Family("qwen2", "Qwen2Config", "Qwen2ForCausalLM", dict),
    Family(
        "qwen2-sliding",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        lambda: {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
        layers=3,
    ),
    Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", lambda: {"head_dim": 16}),
    Family("mistral", "MistralConfig", "MistralForCausalLM", lambda: {"sliding_window": WINDOW}),
    Family(
        "gemma2",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        lambda: {
            "sliding_window": WINDOW,
            "head_dim": 16,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 3.0,
        },
        layers=4,
    ),
    Family(
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        lambda: {"sliding_window": WINDOW, "head_dim": 16},
        layers=6,
    ),
    Family("phi3", "Phi3Config", "Phi3ForCausalLM", lambda: {"sliding_window": WINDOW}),
    Family(
        "granite",
        "GraniteConfig",
        "GraniteForCausalLM",
        lambda: {
            "embedding_multiplier": 2.0,
            "logits_scaling": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.2,
        },
    ),
    Family("olmo2", "Olmo2Config", "Olmo2ForCausalLM", dict),
    Family(
        "mixtral",
        "MixtralConfig",
        "MixtralForCausalLM",
        lambda: {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW},
    ),
    Family("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", dict),
    Family("gpt2", "GPT2Config", "GPT2LMHeadModel", _gpt2, common=False),
    Family(
        "gpt_oss",
        "GptOssConfig",
        "GptOssForCausalLM",
        lambda: {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "head_dim": 16,
            "sliding_window": WINDOW,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 8.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": CONTEXT // 8,
            },
        },
        layers=4,
    ),
]
# Families outside the list the issue names, served because they pass the suite too:
# chunked attention (Llama 4's local layers), Cohere 2's sliding and global layers.
FAMILIES += [
    Family(
        "llama4",
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        lambda: {
            "attention_chunk_size": WINDOW,
            "head_dim": 16,
            "num_local_experts": 2,
            "intermediate_size_mlp": 128,
        },
        layers=4,
    ),
    Family(
        "cohere2",
        "Cohere2Config",
        "Cohere2ForCausalLM",
        lambda: {"sliding_window": WINDOW},
        layers=4,
    ),
]
BY_NAME = {f.name: f for f in FAMILIES}
