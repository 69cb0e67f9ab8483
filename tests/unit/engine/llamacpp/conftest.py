"""The llama.cpp backend's tests: the engine's tiny random models (../conftest.py) written as
f32 GGUF files (tiny_gguf.py) and loaded through gateway.engine.backends.llamacpp.

They need the `llamacpp` extra (llama-cpp-python, built from its sdist by pip: CMake and a
C++ compiler; and gguf); without it every test module here is skipped, saying so
(`needs_llama_cpp`, called first in each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.engine import LoadedModel


def needs_llama_cpp() -> None:
    """Skip the calling test module unless llama_cpp and gguf import."""
    pytest.importorskip(
        "llama_cpp",
        reason="llama-cpp-python is not installed: `.venv/bin/pip install -e '.[llamacpp]'` "
        "builds it from its sdist (CMake, a C++ compiler)",
    )
    pytest.importorskip("gguf", reason="gguf is not installed (the llamacpp extra)")


def _load(path: Path, tokenizer: Path, **kwargs: Any) -> LoadedModel:
    from gateway.engine.backends.llamacpp import load_gguf

    return load_gguf(path, tokenizer=tokenizer, threads=1, **kwargs)


@pytest.fixture(scope="session")
def gguf_files(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from .tiny_gguf import write_llama_gguf

    root = tmp_path_factory.mktemp("gguf")
    return {n: write_llama_gguf(model_dirs[n], root / f"{n}.gguf") for n in ("llama", "draft")}


@pytest.fixture(scope="session")
def cpp_target(gguf_files: dict[str, Path], model_dirs: dict[str, Path]) -> LoadedModel:
    return _load(gguf_files["llama"], model_dirs["llama"])


@pytest.fixture(scope="session")
def cpp_draft(gguf_files: dict[str, Path], model_dirs: dict[str, Path]) -> LoadedModel:
    return _load(gguf_files["draft"], model_dirs["draft"])
