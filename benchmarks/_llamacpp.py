"""llama.cpp as the side-by-side peer: llama-server built from the sources in
llama-cpp-python's sdist, the demo models as GGUF, llama-server started on them. An optional
benchmark extra: `make test` never needs it, and nothing here is committed but this script.

Where: var/llamacpp/ (or $LLAMA_CPP_HOME). Steps, each skipped when its output exists:
1. `pip download --no-binary :all: --no-deps llama-cpp-python` (PyPI), unpacked;
2. cmake with GGML_NATIVE (this CPU's instruction set) and, on x86, without ggml's AMX
   kernels (as the Makefile builds the Python package: they crash on quantized weights),
   building llama-server only (several minutes on 2 cores);
3. the demo models as GGUF (models_registry/gguf.py: f32 written with the gguf package, its
   tensors bitwise those of llama.cpp's convert_hf_to_gguf.py; Q8_0 and Q4_K_M quantized by
   llama.cpp), in var/llamacpp/gguf/<model>/<kind>.gguf beside the model's tokenizer files.
   The gateway's llama.cpp backend and llama-server load the same files.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks._server import wait_ready

ROOT = Path(__file__).resolve().parent.parent
HOME = Path(os.environ.get("LLAMA_CPP_HOME", ROOT / "var" / "llamacpp"))
DEMO = ROOT / "models_registry" / "demo"
MODELS = {
    "target": "demo-code-target-v1",
    "draft_v1": "demo-code-draft-v1",
    "draft_v2": "demo-code-draft-v2",
}


def _say(msg: str) -> None:
    print(f"   [llama.cpp] {msg}", flush=True)


def source() -> Path:
    """The llama.cpp sources (vendor/llama.cpp of the sdist), downloaded when missing."""
    found = sorted(HOME.glob("llama_cpp_python-*/vendor/llama.cpp"))
    if found:
        return found[-1]
    HOME.mkdir(parents=True, exist_ok=True)
    _say("downloading the llama-cpp-python sdist from PyPI")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
         "llama-cpp-python", "-d", str(HOME)],
        check=True,
    )  # fmt: skip
    sdist = sorted(HOME.glob("llama_cpp_python-*.tar.gz"))[-1]
    with tarfile.open(sdist) as tar:
        tar.extractall(HOME, filter="data")
    return sorted(HOME.glob("llama_cpp_python-*/vendor/llama.cpp"))[-1]


def server_binary() -> Path:
    src = source()
    binary = src / "build-server" / "bin" / "llama-server"
    if binary.exists():
        return binary
    _say("building llama-server (GGML_NATIVE, Release; several minutes)")
    flags = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" if platform.machine() == "x86_64" else ""
    subprocess.run(
        ["cmake", "-B", "build-server", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
         "-DLLAMA_BUILD_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_C_FLAGS={flags}",
         f"-DCMAKE_CXX_FLAGS={flags}"],
        cwd=src, check=True, capture_output=True,
    )  # fmt: skip
    jobs = str(os.cpu_count() or 2)
    subprocess.run(
        ["cmake", "--build", "build-server", "-j", jobs, "--target", "llama-server"],
        cwd=src, check=True, capture_output=True,
    )  # fmt: skip
    return binary


def gguf(name: str, kind: str = "f32") -> Path:
    """One demo model (MODELS key) as a GGUF of `kind` (f32, q8_0, q4_k_m), written when
    missing; its folder holds the model's tokenizer files."""
    from models_registry.gguf import convert_model

    out = HOME / "gguf" / MODELS[name] / f"{kind}.gguf"
    if out.exists():
        return out
    _say(f"writing {MODELS[name]} as {kind} GGUF")
    kinds = ("f32",) if kind == "f32" else ("f32", kind)
    convert_model(DEMO / MODELS[name], out.parent, kinds)
    return out


@contextmanager
def server(
    draft: str | None, slots: int, threads: int = 2, n_max: int = 8, kind: str = "f32",
    extra: tuple[str, ...] = (),
) -> Iterator[str]:  # fmt: skip
    """llama-server on the demo target (and `draft`, a MODELS key), both as `kind` GGUF,
    `slots` parallel sequences of 2048 tokens each, `extra` arguments after; yields its
    base URL."""
    binary = server_binary()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        str(binary), "-m", str(gguf("target", kind)), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(slots), "-c", str(2048 * slots), "-t", str(threads), "-tb", str(threads),
        "--no-webui",
    ]  # fmt: skip
    if draft is not None:
        cmd += ["-md", str(gguf(draft, kind)), "--spec-draft-n-max", str(n_max)]
    cmd += extra
    tag = "-extra" if extra else ""  # one log each: several may run at once
    log = HOME / f"server-{draft or 'target'}-{kind}{tag}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log, timeout=120, path="/health", name="llama-server")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
