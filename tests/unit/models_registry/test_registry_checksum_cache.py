"""verify_sha256 with a checksum cache: a restart skips hashing weights whose files stat as
they did when they last matched the manifest, and hashes again after any change to them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import models_registry.manifest as manifest
from models_registry.errors import IntegrityError
from models_registry.manifest import ModelEntry, verify_sha256


def entry_for(folder: Path, data: bytes) -> ModelEntry:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    return ModelEntry(name="m", version="1", role="target", path=folder, sha256=digest)


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, ...]]:
    """The files verify_sha256 read, one tuple per hash."""
    seen: list[tuple[Path, ...]] = []
    real = manifest.sha256_files

    def counting(files: tuple[Path, ...]) -> str:
        seen.append(files)
        return real(files)

    monkeypatch.setattr(manifest, "sha256_files", counting)
    return seen


def test_a_match_is_kept_and_the_next_start_does_not_hash(tmp_path: Path, hashes: list) -> None:
    entry, cache = entry_for(tmp_path / "m", b"weights" * 100), tmp_path / "var" / "sums.json"
    verify_sha256(entry, cache)
    verify_sha256(entry, cache)
    assert len(hashes) == 1
    assert list(json.loads(cache.read_text()).values()) == [entry.sha256]
    verify_sha256(entry)  # without a cache: always hashed
    assert len(hashes) == 2


def test_a_changed_file_is_hashed_again_even_with_its_size_and_mtime_restored(
    tmp_path: Path, hashes: list
) -> None:
    entry, cache = entry_for(tmp_path / "m", b"weights" * 100), tmp_path / "sums.json"
    verify_sha256(entry, cache)
    weights = entry.path / "model.safetensors"
    st = weights.stat()
    weights.write_bytes(b"WEIGHTS" * 100)  # same size
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: ctime still moves
    with pytest.raises(IntegrityError):
        verify_sha256(entry, cache)
    assert len(hashes) == 2
    with pytest.raises(IntegrityError):  # a mismatch is never kept
        verify_sha256(entry, cache)
    assert len(hashes) == 3


def test_a_cache_for_other_weights_or_a_damaged_cache_only_costs_a_hash(
    tmp_path: Path, hashes: list
) -> None:
    cache = tmp_path / "sums.json"
    a, b = entry_for(tmp_path / "a", b"a" * 64), entry_for(tmp_path / "b", b"b" * 64)
    verify_sha256(a, cache)
    verify_sha256(b, cache)
    verify_sha256(a, cache)
    verify_sha256(b, cache)
    assert len(hashes) == 2  # both kept
    cache.write_text("{not json")
    verify_sha256(a, cache)
    verify_sha256(a, cache)
    assert len(hashes) == 3


def test_an_entry_with_another_checksum_is_not_passed_by_the_cache(
    tmp_path: Path, hashes: list
) -> None:
    entry, cache = entry_for(tmp_path / "m", b"weights"), tmp_path / "sums.json"
    verify_sha256(entry, cache)
    other = ModelEntry(**{**entry.__dict__, "sha256": "0" * 64})  # the manifest changed
    with pytest.raises(IntegrityError):
        verify_sha256(other, cache)
