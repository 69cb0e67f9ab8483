"""GGUF files for the llama.cpp backend: a Hugging Face Llama written as an f32 GGUF, a GGUF
quantized by llama.cpp, and the demo pair in f32, Q8_0 and Q4_K_M with a manifest.

    python -m models_registry.gguf demo [--out var/gguf]
    python -m models_registry.gguf convert MODEL_DIR OUT.gguf
    python -m models_registry.gguf quantize IN.gguf OUT.gguf --type q8_0|q4_k_m

`demo` writes, under --out, one folder per demo model (target v1, drafts v1 and v2) holding
f32.gguf, q8_0.gguf, q4_k_m.gguf and the model's tokenizer files (the backend reads the
tokenizer from the GGUF's folder), and manifest.yaml: per quantization a target
`demo-code-target-<quant>` with drafts `demo-code-draft-<quant>` v1 and v2, each entry
`backend: llama.cpp` with its file's sha256. Serve it with GATEWAY_MODELS=<out>/manifest.yaml.
The same inputs give the same bytes: the writer is deterministic, and so is llama.cpp's
quantization.

The writer (`write_llama`) uses the `gguf` package the way llama.cpp's convert_hf_to_gguf.py
(in the llama-cpp-python sdist) writes a Llama: the same keys and tensor names, q and k rows
permuted from Hugging Face's rotate-half rotary layout to llama.cpp's interleaved one, the
byte-level BPE vocabulary with the gpt-2 pre-tokenizer. On the demo target its tensors and
token types are bitwise those of that converter (0.3.36's, told the gpt-2 pre-tokenizer);
the metadata differs in general.* names, and in stating add_bos_token false. It serves Llama
models with a byte-level BPE tokenizer (the demo pair, the tests' tiny models); for other
models use llama.cpp's converter. Quantizing calls `llama_model_quantize` of
llama-cpp-python. Both come with the `llamacpp` extra; they are imported only when called.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

DEMO = Path(__file__).resolve().parent / "demo"
DEMO_MODELS = (  # (name, version, role, folder)
    ("demo-code-target", "1", "target", "demo-code-target-v1"),
    ("demo-code-draft", "1", "draft", "demo-code-draft-v1"),
    ("demo-code-draft", "2", "draft", "demo-code-draft-v2"),
)
QUANTS = {"q8_0": 7, "q4_k_m": 15}  # llama_ftype: LLAMA_FTYPE_MOSTLY_Q8_0, _Q4_K_M
KINDS = ("f32", *QUANTS)
TOKENIZER_FILES = (
    "config.json",  # AutoTokenizer reads the model type from it
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",  # eos ids
    "chat_template.jinja",
)


def _permute(w: Any, heads: int) -> Any:
    """Rows of a q or k projection from rotate-half pairs (i, i + D/2) to adjacent pairs."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_llama(model_dir: Path, out: Path) -> Path:
    """The Hugging Face Llama in `model_dir` (config.json, model.safetensors, a byte-level BPE
    tokenizer) as an f32 GGUF at `out`."""
    import gguf
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("architectures") != ["LlamaForCausalLM"]:
        raise ValueError(f"{model_dir}: not a LlamaForCausalLM (use llama.cpp's converter)")
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    spec = json.loads(tok.backend_tokenizer.to_str())
    if spec["model"]["type"] != "BPE" or "ByteLevel" not in json.dumps(spec["pre_tokenizer"]):
        raise ValueError(f"{model_dir}: not a byte-level BPE tokenizer (use llama.cpp's converter)")
    weights = {
        k: v.to(torch.float32).numpy()
        for k, v in load_file(model_dir / "model.safetensors").items()
    }
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // heads
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))

    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(model_dir.name)
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
    added = tok.added_tokens_decoder
    special = set(tok.all_special_ids) | {i for i, t in added.items() if t.special}
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
    merges = spec["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(int(cfg.get("bos_token_id") or 0))
    w.add_eos_token_id(int(cfg.get("eos_token_id") or 0))
    if cfg.get("pad_token_id") is not None:
        w.add_pad_token_id(int(cfg["pad_token_id"]))
    w.add_add_bos_token(False)
    if isinstance(tok.chat_template, str):
        w.add_chat_template(tok.chat_template)

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


_log: Any = None  # the log callback handed to llama.cpp, kept alive


def quantize(src: Path, dst: Path, kind: str, threads: int = 0) -> Path:
    """`src` (a GGUF) quantized by llama.cpp to `kind` (a QUANTS key) at `dst`. Where a
    tensor's rows do not fit the kind's blocks (K-quants need multiples of 256 columns),
    llama.cpp picks its fallback type for that tensor. threads 0: llama.cpp's default."""
    import llama_cpp as lc

    if kind not in QUANTS:
        raise ValueError(f"unknown quantization {kind!r} ({', '.join(QUANTS)})")
    global _log
    if _log is None:  # llama.cpp's warnings and errors only (not a line per tensor)

        @lc.llama_log_callback  # type: ignore[untyped-decorator]
        def _log(level: int, text: bytes | None, _: Any) -> None:
            if text and level in (3, 4):  # GGML_LOG_LEVEL_WARN, _ERROR
                sys.stderr.write(text.decode(errors="replace"))

        lc.llama_log_set(_log, ctypes.c_void_p())
    lc.llama_backend_init()
    params = lc.llama_model_quantize_default_params()
    params.ftype = QUANTS[kind]
    params.nthread = threads
    dst.parent.mkdir(parents=True, exist_ok=True)
    rc = lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc} for {src} -> {kind}")
    return dst


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert_model(
    model_dir: Path, out_dir: Path, kinds: tuple[str, ...] = KINDS
) -> dict[str, Path]:
    """`model_dir` into `out_dir`: its tokenizer files and one <kind>.gguf per kind (f32
    written, the others quantized from it); {kind: path}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, out_dir / name)
    f32 = write_llama(model_dir, out_dir / "f32.gguf")
    files = {"f32": f32}
    for kind in kinds:
        if kind != "f32":
            files[kind] = quantize(f32, out_dir / f"{kind}.gguf", kind)
    return files


def demo(out: Path, kinds: tuple[str, ...] = KINDS) -> Path:
    """The demo pair under `out` in every kind, and its manifest; returns the manifest path."""
    source = {(e["name"], str(e["version"])): e for e in _demo_manifest()}
    files = {}
    for _, _, _, folder in DEMO_MODELS:
        print(f"converting {folder}: {', '.join(kinds)}", file=sys.stderr, flush=True)
        files[folder] = convert_model(DEMO / folder, out / folder, kinds)
    entries = []
    for kind in kinds:
        for name, version, role, folder in DEMO_MODELS:
            base = source[(name, version)]
            path = files[folder][kind]
            entry: dict[str, Any] = {
                "name": f"{name}-{kind}",
                "version": version,
                "role": role,
                "path": str(path.relative_to(out)),
                "sha256": sha256(path),
                "backend": "llama.cpp",
                "architecture": base.get("architecture"),
                "layers": base.get("layers"),
                "hidden": base.get("hidden"),
                "parameters": base.get("parameters"),
                "tokenizer": base.get("tokenizer"),
                "dtype": kind,
                "trained_on": base.get("trained_on"),
            }
            if role == "draft":
                entry["target"] = f"demo-code-target-{kind}"
            entries.append({k: v for k, v in entry.items() if v is not None})
    manifest = out / "manifest.yaml"
    manifest.write_text(yaml.safe_dump({"models": entries}, sort_keys=False))
    return manifest


def _demo_manifest() -> list[dict[str, Any]]:
    data = yaml.safe_load((DEMO / "manifest.yaml").read_text(encoding="utf-8"))
    return list(data["models"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models_registry.gguf",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="the demo pair as f32, Q8_0 and Q4_K_M GGUF, and a manifest")
    d.add_argument("--out", type=Path, default=Path("var/gguf"))
    d.add_argument("--kinds", default=",".join(KINDS), help=f"among {', '.join(KINDS)}")
    c = sub.add_parser("convert", help="a Hugging Face Llama as an f32 GGUF")
    c.add_argument("model_dir", type=Path)
    c.add_argument("out", type=Path)
    q = sub.add_parser("quantize", help="a GGUF quantized by llama.cpp")
    q.add_argument("src", type=Path)
    q.add_argument("dst", type=Path)
    q.add_argument("--type", choices=sorted(QUANTS), required=True)
    args = parser.parse_args(argv)
    if args.cmd == "demo":
        kinds = tuple(k for k in args.kinds.split(",") if k)
        if "f32" not in kinds or any(k not in KINDS for k in kinds):
            parser.error(f"--kinds: f32 and any of {', '.join(QUANTS)}")
        print(demo(args.out, kinds))
    elif args.cmd == "convert":
        print(write_llama(args.model_dir, args.out))
    else:
        print(quantize(args.src, args.dst, args.type))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
