"""The lean decoder's parity verdict, kept for the next start with the same weights.

At load `accelerate` (attach.py) runs the lean decoder beside the model's own forward on a
few steps and serves it only when their logits are bitwise equal (lean.py `checked`). For
a model of realistic size that is ten forwards of the whole model, and on the weight-major
form the packing of every weight it multiplies: seconds to tens of seconds a start, growing
with the model. The verdict depends on the weights, their dtype and device, the linear form
and joined projections the model was given, the code of both forwards (this package's, the
engine's and transformers') and the machine's arithmetic (CPU model and vector width,
threads), none of which a restart changes. So a passing verdict is kept in the var dir
(``lean-parity.json``) under a key naming all of those, the code as a digest of the
gateway's engine and speed sources; a start with the same key adopts it, any difference
checks again. Only passes are kept: a check that failed (a mismatch or an error, such as
running out of memory) runs again at the next start. An unreadable file is ignored and
rewritten.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers

from gateway.speed.cpu_linear import machine_identity

log = logging.getLogger("gateway.speed.kept_parity")

KEEP = 64  # the latest keys kept (weights, code and settings change over time)
_SOURCES = ("engine", "speed")  # the packages whose code the two forwards run


@functools.cache
def code_digest() -> str:
    """sha256 over the gateway's engine and speed sources (paths and contents)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in _SOURCES:
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".cpp") and path.is_file():
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def parity_key(model: Any, weights: str, weight_major: bool, joined: bool) -> str:
    """What the lean decoder's parity with ``model``'s forward depends on. ``weights``: the
    weights' checksum (the manifest's sha256); ``weight_major``: whether its linear layers
    took the weight-major form; ``joined``: whether it has joined projections."""
    param = next(model.parameters())
    return json.dumps({
        "weights": weights, "architecture": type(model).__name__, "dtype": str(param.dtype),
        "device": str(param.device), "weight_major": weight_major, "joined": joined,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "machine": machine_identity(), "code": code_digest(),
    }, sort_keys=True)  # fmt: skip


class KeptParity:
    """Passing parity verdicts, one JSON file: a list of keys, the latest KEEP."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> list[str]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        return [k for k in data if isinstance(k, str)] if isinstance(data, list) else []

    def passed(self, key: str) -> bool:
        return key in self._read()

    def keep(self, key: str) -> None:
        kept = ([k for k in self._read() if k != key] + [key])[-KEEP:]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:  # whole before it replaces
                f.write(json.dumps(kept, indent=1))
            os.replace(tmp, self.path)
        except OSError as exc:  # serves all the same; the next start checks again
            log.warning("lean decoder parity not kept in %s (%s)", self.path, exc)
