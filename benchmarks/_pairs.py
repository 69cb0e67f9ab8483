"""The demo model pair (or random stand-ins of its shapes) and prompt sets, for the engine
benchmarks (engine, engine_heldout, engine_dtype, engine_kprior, constraints)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gateway.engine import LoadedModel
from gateway.speed import load_fast, wrap_fast

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "models_registry" / "demo" / "manifest.yaml"
PROMPTS = Path(__file__).resolve().parent / "prompts" / "code.jsonl"


@dataclass
class Pair:
    target: LoadedModel
    drafts: dict[str, LoadedModel]  # v1, v2 and v2_full_head
    source: str


def load_pair(
    dtype: torch.dtype | None = None, cpu_linear: bool | None = None, compiled: bool = False
) -> Pair:
    """The demo pair in `dtype` (the engine's default when None); cpu_linear=False keeps
    torch's own nn.Linear forward (see gateway/speed/cpu_linear.py); `compiled`: its steps
    are to be compiled (the linear forward is then timed as the compiled step multiplies)."""
    if MANIFEST.exists():
        import yaml

        entries = yaml.safe_load(MANIFEST.read_text())["models"]

        def find(name: str, version: str, draft_vocab: bool = False) -> LoadedModel:
            for e in entries:
                if e["name"] == name and str(e["version"]) == version:
                    path = MANIFEST.parent / e["path"]
                    return load_fast(path, dtype=dtype, draft_vocab=draft_vocab,
                                      cpu_linear=cpu_linear, compiled=compiled)  # fmt: skip
            raise KeyError(f"{name} v{version} is not in {MANIFEST}")

        drafts = {
            "v1": find("demo-code-draft", "1", draft_vocab=True),
            "v2": find("demo-code-draft", "2", draft_vocab=True),
            "v2_full_head": find("demo-code-draft", "2"),
        }
        return Pair(find("demo-code-target", "1"), drafts, str(MANIFEST.relative_to(ROOT)))
    print(
        f"!! {MANIFEST.relative_to(ROOT)} is missing (demo models not trained yet): using "
        "RANDOM-WEIGHT models of the demo shapes; speeds measure overhead only, acceptance "
        "numbers are meaningless",
        file=sys.stderr,
    )
    return random_pair(dtype, cpu_linear, compiled)


def random_pair(
    dtype: torch.dtype | None = None, cpu_linear: bool | None = None, compiled: bool = False
) -> Pair:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()]
    texts += [p.read_text() for p in (ROOT / "gateway" / "engine").rglob("*.py")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")

    def build(layers: int, hidden: int, heads: int, seed: int) -> LoadedModel:
        torch.manual_seed(seed)
        cfg = LlamaConfig(
            vocab_size=len(fast),
            hidden_size=hidden,
            intermediate_size=3 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            max_position_embeddings=2048,
            eos_token_id=0,
            bos_token_id=0,
            pad_token_id=0,
        )
        model = LlamaForCausalLM(cfg)
        return wrap_fast(model if dtype is None else model.to(dtype), fast, cpu_linear=cpu_linear,
                          compiled=compiled)  # fmt: skip

    v2 = build(1, 192, 3, 3)
    return Pair(build(12, 256, 4, 1), {"v1": build(1, 192, 3, 2), "v2": v2, "v2_full_head": v2},
                "random")  # fmt: skip


def load_prompts(tokenizer: Any, path: Path) -> list[tuple[int, ...]]:
    """Token ids of every {"prompt": ...} line of a JSONL prompt set."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [tuple(tokenizer(x["prompt"], add_special_tokens=False)["input_ids"]) for x in lines]
