"""Facts about a model directory read without loading its weights.

The engine loads tensors; the registry only needs their hash, their count and their dtype,
which the safetensors header gives (8-byte little-endian length, then a JSON table of
``name -> {dtype, shape, data_offsets}``), and the architecture from ``config.json``.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models_registry.errors import ModelNotFound, RegistryError

SINGLE_FILE = "model.safetensors"
_MAX_HEADER_BYTES = 100 * 1024 * 1024
_DTYPE_NAMES = {
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I8": "int8",
    "U8": "uint8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "BOOL": "bool",
}


@dataclass(frozen=True)
class WeightsInfo:
    """What a directory's safetensors files say about the model, without reading tensors."""

    files: tuple[Path, ...]
    parameters: int
    dtype: str


@dataclass(frozen=True)
class ConfigInfo:
    """The fields of ``config.json`` the manifest records (None where the config lacks them)."""

    architecture: str | None
    layers: int | None
    hidden: int | None
    vocab_size: int | None


def weight_files(model_dir: Path) -> tuple[Path, ...]:
    """``model.safetensors`` if present, else every ``*.safetensors`` shard sorted by name.

    Raises ModelNotFound when the directory or its weights are missing.
    """
    if not model_dir.is_dir():
        raise ModelNotFound(f"model directory {model_dir} does not exist")
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return (single,)
    shards = tuple(sorted(p for p in model_dir.glob("*.safetensors") if p.is_file()))
    if not shards:
        raise ModelNotFound(f"model directory {model_dir} holds no *.safetensors file")
    return shards


def sha256_files(files: tuple[Path, ...]) -> str:
    """SHA-256 of the files' bytes, concatenated in the given order (one file: its own hash)."""
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (tensor table plus optional ``__metadata__``)."""
    with path.open("rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise RegistryError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", raw_len)
        if length > _MAX_HEADER_BYTES:
            raise RegistryError(f"{path}: safetensors header claims {length} bytes")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RegistryError(f"{path}: unreadable safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise RegistryError(f"{path}: safetensors header is not a JSON object")
    return header


def weights_info(model_dir: Path) -> WeightsInfo:
    """Parameter count (sum of tensor sizes) and dominant dtype across the weight files.

    Tied weights are stored once by ``save_pretrained``, so the count equals
    ``sum(p.numel() for p in model.parameters())``.
    """
    files = weight_files(model_dir)
    total = 0
    dtypes: Counter[str] = Counter()
    for path in files:
        for name, spec in read_safetensors_header(path).items():
            if name == "__metadata__":
                continue
            size = math.prod(int(d) for d in spec["shape"])
            total += size
            dtypes[_DTYPE_NAMES.get(spec["dtype"], spec["dtype"].lower())] += size
    dtype = dtypes.most_common(1)[0][0] if dtypes else "unknown"
    return WeightsInfo(files=files, parameters=total, dtype=dtype)


def read_config(model_dir: Path) -> ConfigInfo:
    """Architecture, depth, width and logits width from ``config.json`` (all None if absent)."""
    path = model_dir / "config.json"
    if not path.is_file():
        return ConfigInfo(None, None, None, None)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RegistryError(f"{path}: invalid JSON: {exc}") from exc
    archs = cfg.get("architectures") or []
    text_cfg = cfg.get("text_config") or {}

    def field(key: str) -> int | None:
        value = cfg.get(key, text_cfg.get(key))
        return int(value) if isinstance(value, int) else None

    return ConfigInfo(
        architecture=str(archs[0]) if archs else None,
        layers=field("num_hidden_layers"),
        hidden=field("hidden_size"),
        vocab_size=field("vocab_size"),
    )
