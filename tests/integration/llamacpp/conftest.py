"""The integration tests of the torch demo's service, run again with the tiny pair on the
llama.cpp backend (issue 49): the same models (tests/integration/tiny_models.py) written as
f32 GGUF files beside their tokenizers, the manifest naming them with `backend: llama.cpp`.

`tiny_manifest` here replaces tests/integration/conftest.py's for every test collected
under this folder, so a test function imported from a torch-side module (policy,
constraints, tools, audit, rollouts, batching, cancellation) runs unchanged on the GGUF
pair. Which ones run here, and what does not carry over: docs/backends.md (known gaps)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

import pytest
import yaml

from tests.integration import tiny_models


def gguf_build(root: Path, **kwargs: Any) -> Path:
    """`tiny_models.build(root, **kwargs)` with every model written as model.gguf in its
    folder, and a manifest (gguf-manifest.yaml) naming the GGUF files on the llama.cpp
    backend, checksummed like the safetensors entries."""
    from models_registry.gguf import sha256, write_llama

    data = yaml.safe_load(tiny_models.build(root, **kwargs).read_text())
    for entry in data["models"]:
        folder = root / entry["path"]
        out = write_llama(folder, folder / "model.gguf")
        entry.update(path=str(out.relative_to(root)), sha256=sha256(out), backend="llama.cpp")
        entry.pop("architecture", None)
    manifest = root / "gguf-manifest.yaml"
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    return manifest


@pytest.fixture(scope="session")
def tiny_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gguf_build(tmp_path_factory.mktemp("gguf-models"))


def adopt(module: ModuleType, into: dict[str, Any], gaps: Mapping[str, str] = {}) -> None:
    """Every test function of the torch-side `module` as a test of the module whose
    globals are `into` (a copy: marks added here stay here), so it runs with the fixtures
    there (this folder's `tiny_manifest`, a `gw` of the GGUF pair). A test named in `gaps`
    runs too, marked as expected to fail for the reason given (strict: once it passes, the
    gap is gone and the mark fails the run)."""
    for name, f in vars(module).items():
        if not name.startswith("test_") or not isinstance(f, FunctionType):
            continue
        g = FunctionType(f.__code__, f.__globals__, name, f.__defaults__, f.__closure__)
        g.__kwdefaults__, g.__annotations__ = f.__kwdefaults__, f.__annotations__
        g.__doc__, g.__qualname__ = f.__doc__, f.__qualname__
        g.__dict__.update({k: list(v) if k == "pytestmark" else v for k, v in vars(f).items()})
        if name in gaps:
            g = pytest.mark.xfail(strict=True, reason=gaps[name])(g)
        into[name] = g
