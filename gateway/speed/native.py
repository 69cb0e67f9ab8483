"""The C++ kernel of the op `gateway::linear_rows` (linear_rows.cpp): built once per source,
torch version and compiler with the host's C++ compiler (the one inductor compiles its CPU
kernels with), kept in torch's extensions folder, and loaded into the process.

packed_linear.py calls `load` when it defines the op, and registers its Python kernel
instead where this returns False: no compiler, no writable folder, a failed build or load
(logged once, with the reason). Both kernels compute the same products with the same
calls, bitwise (tests/unit/speed/test_packed_linear.py).

`make` builds it with the install (by importing packed_linear), so a process only loads
it; one started after its source changed builds it first (about 10 s on 2 cores).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

import torch

log = logging.getLogger("gateway.speed.native")

SOURCE = Path(__file__).with_name("linear_rows.cpp")
BUILD_TIMEOUT_S = 300


def _compiler() -> str | None:
    """The C++ compiler: $CXX where set (the usual convention), else c++ or g++ on PATH."""
    named = os.environ.get("CXX")
    return shutil.which(named) if named else (shutil.which("c++") or shutil.which("g++"))


def _command(compiler: str, target: Path) -> list[str]:
    from torch.utils import cpp_extension

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    libraries = cpp_extension.library_paths()
    return [
        compiler, "-O2", "-shared", "-fPIC", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{p}" for p in cpp_extension.include_paths()),
        str(SOURCE), "-o", str(target),
        *(f"-L{p}" for p in libraries), "-lc10", "-ltorch_cpu",
        *(f"-Wl,-rpath,{p}" for p in libraries),
    ]  # fmt: skip


def library(compiler: str) -> Path:
    """Where the kernel built from this source, for this torch and compiler, is kept: in
    $TORCH_EXTENSIONS_DIR where set, else torch's default (~/.cache/torch_extensions), as
    torch's own just-in-time extensions."""
    from torch.utils import cpp_extension

    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update(repr(_command(compiler, Path("out"))).encode())
    digest.update(torch.__version__.encode())
    name = f"gateway_linear_rows-{digest.hexdigest()[:16]}.so"
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / "gateway" / name


def build(compiler: str, target: Path) -> None:
    """Compile the kernel into `target` (a file of its own first, then renamed: processes
    building at once each get a whole library)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        done = subprocess.run(
            _command(compiler, tmp), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


@functools.cache
def load() -> bool:
    """Whether the C++ kernel is built (now, if need be) and registered in this process."""
    if not torch.backends.mkldnn.is_available():
        log.info("gateway::linear_rows: Python kernel (torch built without oneDNN)")
        return False
    try:
        compiler = _compiler()
        if compiler is None:
            raise RuntimeError("no C++ compiler on PATH (set CXX)")
        target = library(compiler)
        if not target.exists():
            log.info("gateway::linear_rows: building its C++ kernel into %s", target)
            build(compiler, target)
        torch.ops.load_library(str(target))
    except Exception as exc:  # serves all the same, with the Python kernel
        log.warning("gateway::linear_rows: Python kernel (the C++ one: %s)", exc)
        return False
    return True
