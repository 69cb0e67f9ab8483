"""llama.cpp as the side-by-side peer: built from the sources in llama-cpp-python's sdist, the
demo models converted to GGUF, llama-server started on them. An optional benchmark extra:
`make test` never needs it, and nothing here is committed but this script.

Where: var/llamacpp/ (or $LLAMA_CPP_HOME). Steps, each skipped when its output exists:
1. `pip download --no-binary :all: --no-deps llama-cpp-python` (PyPI), unpacked;
2. cmake with GGML_NATIVE (this CPU's instruction set), building llama-server only
   (about 8 minutes on 2 cores);
3. `convert_hf_to_gguf.py` from the same sources, f32, for the target and both drafts. The
   demo tokenizer is a byte-level BPE the converter does not know by its hash; it is
   converted with the gpt-2 pre-tokenizer, which splits text the same way (the outputs are
   compared with ours token for token by the benchmark). The converter needs sentencepiece
   at import, installed beside it (var/llamacpp/pydeps), not into the project's venv.
"""

from __future__ import annotations

import os
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

CONVERT = """
import runpy, sys
src, deps = sys.argv[1], sys.argv[2]
sys.path[:0] = [src, src + "/gguf-py"]
sys.path.append(deps)
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[3:]]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


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
    binary = src / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    _say("building llama-server (GGML_NATIVE, Release; several minutes)")
    subprocess.run(
        ["cmake", "-B", "build", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
         "-DLLAMA_BUILD_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release"],
        cwd=src, check=True, capture_output=True,
    )  # fmt: skip
    jobs = str(os.cpu_count() or 2)
    subprocess.run(
        ["cmake", "--build", "build", "-j", jobs, "--target", "llama-server"],
        cwd=src, check=True, capture_output=True,
    )  # fmt: skip
    return binary


def gguf(name: str) -> Path:
    """The f32 GGUF of one demo model (MODELS key), converted when missing."""
    out = HOME / "gguf" / f"{MODELS[name]}.gguf"
    if out.exists():
        return out
    src = source()
    deps = HOME / "pydeps"
    if not (deps / "sentencepiece").exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", str(deps), "sentencepiece"],
            check=True,
        )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    _say(f"converting {MODELS[name]} to GGUF")
    subprocess.run(
        [sys.executable, "-c", CONVERT, str(src), str(deps), str(DEMO / MODELS[name]),
         "--outtype", "f32", "--outfile", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    return out


@contextmanager
def server(draft: str | None, slots: int, threads: int = 2, n_max: int = 8) -> Iterator[str]:
    """llama-server on the demo target (and `draft`, a MODELS key), `slots` parallel
    sequences of 2048 tokens each; yields its base URL."""
    binary = server_binary()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        str(binary), "-m", str(gguf("target")), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(slots), "-c", str(2048 * slots), "-t", str(threads), "-tb", str(threads),
        "--no-webui",
    ]  # fmt: skip
    if draft is not None:
        cmd += ["-md", str(gguf(draft)), "--spec-draft-n-max", str(n_max)]
    log = HOME / f"server-{draft or 'target'}.log"  # one each: two may run at once
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log, timeout=120, path="/health", name="llama-server")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
