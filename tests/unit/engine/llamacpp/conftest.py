"""The llama.cpp backend's tests: the engine's tiny random models (../conftest.py) written as
f32 GGUF files (tiny_gguf.py) and loaded through gateway.engine.backends.llamacpp.

They need the `llamacpp` extra (llama-cpp-python, built from its sdist by pip: CMake and a
C++ compiler; and gguf); without it every test here is skipped, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "llama_cpp",
    reason="llama-cpp-python is not installed: `.venv/bin/pip install -e '.[llamacpp]'` "
    "builds it from its sdist (CMake, a C++ compiler)",
)
pytest.importorskip("gguf", reason="gguf is not installed (the llamacpp extra)")

from gateway.engine import LoadedModel
from gateway.engine.backends.llamacpp import load_gguf

from .tiny_gguf import write_llama_gguf


@pytest.fixture(scope="session")
def gguf_files(
    model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {
        name: write_llama_gguf(model_dirs[name], root / f"{name}.gguf")
        for name in ("llama", "draft")
    }


@pytest.fixture(scope="session")
def cpp_target(gguf_files: dict[str, Path], model_dirs: dict[str, Path]) -> LoadedModel:
    return load_gguf(gguf_files["llama"], tokenizer=model_dirs["llama"], threads=1)


@pytest.fixture(scope="session")
def cpp_draft(gguf_files: dict[str, Path], model_dirs: dict[str, Path]) -> LoadedModel:
    return load_gguf(gguf_files["draft"], tokenizer=model_dirs["draft"], threads=1)
