"""Which backend loads a model: the dispatch the model pool calls (serving/models.py), by the
manifest entry's `backend` (models_registry.manifest BACKENDS).

- None or "torch": a directory of safetensors through transformers (models.load_model;
  the serving pool loads those through gateway/speed's `load_fast`).
- "llama.cpp": one GGUF file through llama.cpp (backends/llamacpp.py), on the CPU, with as
  many threads as torch has (the worker sets them: GATEWAY_TORCH_THREADS); its tokenizer is
  the Hugging Face tokenizer in the file's folder. llama_cpp is imported only here, so a
  deployment without the `llamacpp` extra serves torch models as before and refuses a GGUF
  entry with the reason.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gateway.engine.errors import UnsupportedModel
from gateway.engine.models import LoadedModel, load_model

INSTALL = "pip install -e '.[llamacpp]' (builds llama-cpp-python from its sdist)"


def load(path: str | Path, backend: str | None = None, device: str | None = None) -> LoadedModel:
    """The model at `path` on its backend. For llama.cpp, `device` must be the CPU or unset
    (the GGUF's own types serve; its KV cache is f16; nothing of gateway/speed applies).
    Raises UnsupportedModel where the backend cannot serve it (unknown backend, no
    llama_cpp, a device it does not run on). Torch models load through gateway/speed's
    `load_fast` instead (serving/models.py), which this core module cannot import."""
    if backend in (None, "torch"):
        return load_model(path, device)
    if backend != "llama.cpp":
        raise UnsupportedModel(f"unknown backend {backend!r} (torch, llama.cpp)")
    if device is not None and torch.device(device).type != "cpu":
        raise UnsupportedModel(f"the llama.cpp backend runs on the CPU, not {device}")
    try:
        from gateway.engine.backends.llamacpp import load_gguf
    except ImportError as exc:
        raise UnsupportedModel(f"llama-cpp-python is not installed: {INSTALL}") from exc
    try:
        return load_gguf(path, threads=torch.get_num_threads())
    except ValueError as exc:  # llama.cpp could not read the file
        raise UnsupportedModel(str(exc)) from exc
