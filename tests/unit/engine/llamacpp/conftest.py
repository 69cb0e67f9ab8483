"""The llama.cpp backend's tests: the engine's tiny random models (../conftest.py) written as
f32 GGUF files (models_registry/gguf.py) and loaded through gateway.engine.backends.llamacpp.

They need the `llamacpp` extra (llama-cpp-python, built from its sdist by pip: CMake and a
C++ compiler; and gguf), which `make test` installs. Without it every test module here is
skipped, saying so, or under CI=true fails (`needs_llama_cpp`, called first in each)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import pytest

from gateway.engine import LoadedModel

INSTALL = "`make test` installs it, or `.venv/bin/pip install -e '.[llamacpp]'`"


def needs_llama_cpp() -> None:
    """Skip the calling test module unless llama_cpp and gguf import; under CI=true a
    missing one fails it instead (make test installs them: the Makefile's llamacpp target)."""
    for module, package in (("llama_cpp", "llama-cpp-python"), ("gguf", "gguf")):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            why = f"{package} is not installed ({exc}): {INSTALL}"
            if os.environ.get("CI") == "true":
                pytest.fail(why)
            pytest.skip(why, allow_module_level=True)


def _load(path: Path, tokenizer: Path, **kwargs: Any) -> LoadedModel:
    from gateway.engine.backends.llamacpp import load_gguf

    return load_gguf(path, tokenizer=tokenizer, threads=1, **kwargs)


@pytest.fixture(scope="session")
def gguf_files(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from models_registry.gguf import write_llama

    root = tmp_path_factory.mktemp("gguf")
    return {n: write_llama(model_dirs[n], root / f"{n}.gguf") for n in ("llama", "draft")}


@pytest.fixture(scope="session")
def cpp_target(gguf_files: dict[str, Path], model_dirs: dict[str, Path]) -> LoadedModel:
    return _load(gguf_files["llama"], model_dirs["llama"])


@pytest.fixture(scope="session")
def cpp_draft(gguf_files: dict[str, Path], model_dirs: dict[str, Path]) -> LoadedModel:
    return _load(gguf_files["draft"], model_dirs["draft"])


def _wide(root: Path, tokenizer: Path, layers: int) -> Path:
    """A Llama 256 wide (K-quants need rows of 256) at Q4_K_M, with the tiny llama's
    tokenizer: its weights are of the types ggml's tiled products serve."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from models_registry.gguf import quantize, write_llama

    tok = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
    torch.manual_seed(4)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(root)
    tok.save_pretrained(root)
    return quantize(write_llama(root, root / "f32.gguf"), root / "q4_k_m.gguf", "q4_k_m")


@pytest.fixture(scope="session")
def wide_q4(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One layer (`_wide`)."""
    return _wide(tmp_path_factory.mktemp("wide"), model_dirs["llama"], 1)


@pytest.fixture(scope="session")
def deep_q4(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three layers (`_wide`): a prompt's keys and values past the first layer come out of
    whole layers' products."""
    return _wide(tmp_path_factory.mktemp("deep"), model_dirs["llama"], 3)
