"""benchmarks/realistic.py's models: Qwen2-shaped targets of the sizes people run with
random weights (the recipe of realistic.py's docstring) and a draft truncated from each,
built on the fly and saved as bf16 safetensors with a manifest (run in a process of its
own: `python -m benchmarks.realistic build <json>`)."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "models_registry" / "demo" / "demo-code-target-v1"
RECIPE = 2  # bump when the weights' recipe changes: cached models are rebuilt
VOCAB = 151936
CONTEXT = 2048
DRAFT_LAYERS = 2
DRAFT_VOCAB = 32768
"""The draft's drafting vocabulary (draft_vocab.json, gateway/engine/draft_head.py): the
32,768 lowest ids, a reduced head as the product offers drafts (FR-Spec drafts among 32K of
Llama 3's 128K tokens). It holds every id the demo tokenizer can produce (8,192), so
acceptance is the full head's; a drafted token costs 2 layers and a 32K-row head instead
of a 151,936-row one (at 1.5B the full head alone outweighs the draft's layers)."""
LATER = 0.08  # the later layers' share of the residual stream, against the draft's layers
QWEN2_5: dict[str, Any] = {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu"}
SHAPES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864},
    "qwen2.5-1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12,
                     "num_key_value_heads": 2, "intermediate_size": 8960},
    "qwen2-tiny": {"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 1024},
}  # fmt: skip
TINY_VOCAB = 8192  # the tiny shape's vocabulary (the unit test's)


def _config(shape: str, layers: int | None = None) -> Any:
    from transformers import Qwen2Config

    dims: dict[str, Any] = dict(SHAPES[shape])
    if layers is not None:
        dims["num_hidden_layers"] = layers
    return Qwen2Config(
        vocab_size=TINY_VOCAB if shape == "qwen2-tiny" else VOCAB,
        max_position_embeddings=CONTEXT, tie_word_embeddings=True, use_sliding_window=False,
        bos_token_id=0, eos_token_id=0, **dims, **QWEN2_5,
    )  # fmt: skip


def init_weights(model: Any, usable: int, draft_layers: int, seed: int = 0) -> None:
    """The recipe of benchmarks/realistic.py's docstring, in place: embeddings N(0, 0.02)
    with the rows of ids >= `usable` and of the tokenizer's special ids (0, 1, 2) zero;
    every projection N(0, 1/fan_in) (output projections of the layers past `draft_layers`
    scaled so their sum is about LATER of the first layers'); biases 0, norms 1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    layers = int(model.config.num_hidden_layers)
    later = LATER * math.sqrt(draft_layers / max(1, layers - draft_layers))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            elif "embed_tokens" in name:
                p.normal_(0.0, 0.02, generator=g)
                p[usable:] = 0
                p[:3] = 0
            else:
                std = 1.0 / math.sqrt(p.shape[1])
                layer = int(name.split("layers.")[1].split(".")[0])
                if name.endswith(("o_proj.weight", "down_proj.weight")) and layer >= draft_layers:
                    std *= later
                p.normal_(0.0, std, generator=g)


def build(shape: str, folder: Path) -> dict[str, Any]:
    """Target and draft of `shape` in `folder` (target/, draft/, manifest.yaml), bf16 on
    disk; reused when `folder/built.json` says the same recipe built them."""
    import torch
    import yaml
    from transformers import Qwen2ForCausalLM

    from models_registry.weights import sha256_files, weight_files

    done = folder / "built.json"
    if done.exists():
        info = json.loads(done.read_text())
        if info.get("recipe") == RECIPE:
            return {**info, "reused": True}
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    model: Any = Qwen2ForCausalLM(_config(shape))
    torch.set_default_dtype(torch.float32)
    usable = min(_tokenizer_size(), model.config.vocab_size)
    init_weights(model, usable, DRAFT_LAYERS)
    params = sum(p.numel() for p in model.parameters())
    made = time.perf_counter() - t0
    entries = []
    for role, m in (("target", model), ("draft", None)):
        if m is None:  # the draft: the target's first layers, its norm and head
            model.model.layers = model.model.layers[:DRAFT_LAYERS]
            model.config.num_hidden_layers = DRAFT_LAYERS
            model.config.layer_types = model.config.layer_types[:DRAFT_LAYERS]
            m = model
        out = folder / role
        m.save_pretrained(out)
        if role == "draft":
            ids = list(range(min(DRAFT_VOCAB, int(m.config.vocab_size))))
            vocab = {"token_ids": ids, "size": len(ids), "ranked_by": "lowest ids"}
            (out / "draft_vocab.json").write_text(json.dumps(vocab) + "\n")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(DEMO / name, out / name)
        files = weight_files(out)
        entries.append({
            "name": f"realistic-{shape}" + ("-draft" if role == "draft" else ""),
            "version": "1", "role": role, "path": role,
            "sha256": sha256_files(files), "architecture": "Qwen2ForCausalLM",
            **({"target": f"realistic-{shape}"} if role == "draft" else {}),
        })  # fmt: skip
    (folder / "manifest.yaml").write_text(yaml.safe_dump({"models": entries}, sort_keys=False))
    info = {
        "recipe": RECIPE, "shape": shape, "parameters": params,
        "draft_parameters": sum(p.numel() for p in model.parameters()),
        "disk_bytes": {r: sum(f.stat().st_size for f in weight_files(folder / r))
                       for r in ("target", "draft")},
        "draft_vocab": min(DRAFT_VOCAB, VOCAB if shape != "qwen2-tiny" else TINY_VOCAB),
        "build_s": round(time.perf_counter() - t0, 1), "init_s": round(made, 1),
    }  # fmt: skip
    done.write_text(json.dumps(info))
    return {**info, "reused": False}


def _tokenizer_size() -> int:
    return len(json.loads((DEMO / "tokenizer.json").read_text())["model"]["vocab"])
