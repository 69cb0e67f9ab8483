"""Manifest entries on the llama.cpp backend (`backend: llama.cpp`, a .gguf file): parsed,
checksummed like safetensors, refused where the path is no GGUF; and the pool's dispatch by
backend (gateway/engine/backends/loading.py) refusing what it cannot serve. No llama_cpp
needed: the GGUF bytes here are never loaded."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from gateway.engine import UnsupportedModel
from gateway.engine.backends import loading
from models_registry.errors import IntegrityError, ManifestError, ModelNotFound
from models_registry.manifest import dump_manifest, entry_files, load_manifest, verify_sha256


def _manifest(folder: Path, path: str, backend: str | None = "llama.cpp") -> Path:
    entry = {"name": "g", "version": "1", "role": "target", "path": path,
             "sha256": "0" * 64}  # fmt: skip
    if backend is not None:
        entry["backend"] = backend
    out = folder / "manifest.yaml"
    out.write_text(yaml.safe_dump({"models": [entry]}))
    return out


def _gguf(folder: Path, data: bytes = b"GGUF fake weights") -> tuple[Path, str]:
    (folder / "m").mkdir(parents=True, exist_ok=True)
    path = folder / "m" / "q8_0.gguf"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def test_a_gguf_entry_is_checksummed_on_its_file(tmp_path: Path) -> None:
    path, digest = _gguf(tmp_path)
    text = _manifest(tmp_path, "m/q8_0.gguf").read_text().replace("0" * 64, digest)
    (tmp_path / "manifest.yaml").write_text(text)
    entry = load_manifest(tmp_path / "manifest.yaml").entries[0]
    assert entry.backend == "llama.cpp" and entry.path == path.resolve()
    assert entry_files(entry) == (path.resolve(),)
    verify_sha256(entry)
    path.write_bytes(b"GGUF other weights")  # negative control: other bytes fail
    with pytest.raises(IntegrityError):
        verify_sha256(entry)
    path.unlink()
    with pytest.raises(ModelNotFound):
        verify_sha256(entry)


def test_the_backend_field_round_trips_and_defaults_to_torch(tmp_path: Path) -> None:
    _gguf(tmp_path)
    manifest = load_manifest(_manifest(tmp_path, "m/q8_0.gguf"))
    dump_manifest(manifest, tmp_path / "again.yaml")
    assert load_manifest(tmp_path / "again.yaml").entries[0].backend == "llama.cpp"
    assert load_manifest(_manifest(tmp_path, "m", backend=None)).entries[0].backend is None


def test_a_llama_cpp_entry_must_name_a_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"serves a \.gguf file"):
        load_manifest(_manifest(tmp_path, "m"))
    with pytest.raises(ManifestError, match="backend"):
        load_manifest(_manifest(tmp_path, "m/q8_0.gguf", backend="vllm"))


def test_the_dispatch_refuses_what_a_backend_cannot_serve(tmp_path: Path) -> None:
    path, _ = _gguf(tmp_path)
    with pytest.raises(UnsupportedModel, match="unknown backend"):
        loading.load(path, "vllm")
    with pytest.raises(UnsupportedModel, match="on the CPU"):
        loading.load(path, "llama.cpp", device="cuda")
    with pytest.raises(UnsupportedModel):  # not installed, or llama.cpp cannot read the file
        loading.load(path, "llama.cpp")
