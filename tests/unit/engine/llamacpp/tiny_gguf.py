"""A saved Hugging Face Llama (config, safetensors, byte-level BPE tokenizer) written as an
f32 GGUF with the `gguf` package, the way llama.cpp's convert_hf_to_gguf.py writes a Llama:
the same keys and tensor names, q and k rows permuted from Hugging Face's rotate-half rotary
layout to llama.cpp's interleaved one. For the tiny random test models only (no sentencepiece,
no quantization); the demo pair is converted by llama.cpp's own converter
(benchmarks/_llamacpp.py `gguf`). Checked once against that converter (0.3.36's) on the tests'
tiny Llama: the same tensors bitwise and the same keys but its general.* metadata and padding id.
The tests also check llama.cpp's logits on it against the torch model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q or k projection from rotate-half pairs (i, i + D/2) to adjacent pairs."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_llama_gguf(model_dir: Path, out: Path) -> Path:
    cfg = json.loads((model_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    weights = {
        k: v.to(torch.float32).numpy()
        for k, v in load_file(model_dir / "model.safetensors").items()
    }
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // heads
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    vocab = tok.get_vocab()
    by_id = {i: s for s, i in vocab.items()}
    special = set(tok.all_special_ids)
    added = set(tok.added_tokens_decoder)
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        tokens.append(by_id.get(i, f"[PAD{i}]"))
        if i in special:
            types.append(gguf.TokenType.CONTROL)
        elif i in added:
            types.append(gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            types.append(gguf.TokenType.NORMAL)
        else:
            types.append(gguf.TokenType.UNUSED)
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(int(cfg.get("bos_token_id") or 0))
    w.add_eos_token_id(int(cfg.get("eos_token_id") or 0))
    w.add_add_bos_token(False)

    w.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", weights[p + "input_layernorm.weight"])
        w.add_tensor(b + "attn_q.weight", _permute(weights[p + "self_attn.q_proj.weight"], heads))
        w.add_tensor(
            b + "attn_k.weight", _permute(weights[p + "self_attn.k_proj.weight"], kv_heads)
        )
        w.add_tensor(b + "attn_v.weight", weights[p + "self_attn.v_proj.weight"])
        w.add_tensor(b + "attn_output.weight", weights[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_norm.weight", weights[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "ffn_gate.weight", weights[p + "mlp.gate_proj.weight"])
        w.add_tensor(b + "ffn_up.weight", weights[p + "mlp.up_proj.weight"])
        w.add_tensor(b + "ffn_down.weight", weights[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", weights["model.norm.weight"])
    if "lm_head.weight" in weights and not cfg.get("tie_word_embeddings"):
        w.add_tensor("output.weight", weights["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
