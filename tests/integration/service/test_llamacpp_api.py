# ruff: noqa: E402  (the imports below need llama_cpp: the module is skipped first without it)
"""The gateway serving GGUF models on the llama.cpp backend: a real `python -m gateway`
process on the tiny pair written as f32 GGUF files (manifest entries `backend: llama.cpp`,
checksummed like safetensors). Over HTTP, the same policy, proposers and audit as on the
torch backend: a greedy speculative chat completion gives the standard one's text, and both
are audited with the GGUF entries' names, versions and checksums."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.unit.engine.llamacpp.conftest import needs_llama_cpp

needs_llama_cpp()

from models_registry.gguf import sha256, write_llama
from models_registry.manifest import load_manifest
from tests.integration import tiny_models
from tests.integration.service.harness import ADMIN, MODEL
from tests.integration.service.process import start_gateway


def gguf_manifest(root: Path) -> Path:
    """The tiny target and its random draft (v2; tests/integration/tiny_models.py) with
    each model written as model.gguf beside its tokenizer, and a manifest naming the GGUF
    files. (Draft v1, a copy of the target, would accept every token.)"""
    torch_manifest = tiny_models.build(root)
    data = yaml.safe_load(torch_manifest.read_text())
    data["models"] = [e for e in data["models"] if (e["name"], e["version"]) != ("tiny-draft", "1")]
    for entry in data["models"]:
        out = write_llama(root / entry["path"], root / entry["path"] / "model.gguf")
        entry.update(path=str(out.relative_to(root)), sha256=sha256(out), backend="llama.cpp")
    manifest = root / "gguf-manifest.yaml"
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    return manifest


@dataclass
class Server:
    url: str
    key: str
    proc: subprocess.Popen[bytes]
    manifest: Path

    def chat(self, content: str, **params: Any) -> httpx.Response:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **params}
        return httpx.post(
            f"{self.url}/v1/chat/completions", json=body, timeout=120,
            headers={"authorization": f"Bearer {self.key}"},
        )  # fmt: skip

    def record(self, request_id: str) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/audit/records", params={"limit": 1000}, headers=ADMIN)
        assert r.status_code == 200, r.text
        found = [x for x in r.json()["data"] if x["request_id"] == request_id]
        assert len(found) == 1, request_id
        return found[0]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    manifest = gguf_manifest(tmp_path_factory.mktemp("gguf-models"))
    proc, url, key = start_gateway(manifest, tmp_path_factory.mktemp("gguf-server"))
    yield Server(url, key, proc, manifest)
    proc.terminate()
    proc.wait(timeout=60)


def test_the_manifest_names_gguf_files_on_the_llama_cpp_backend(server: Server) -> None:
    entries = load_manifest(server.manifest).entries
    assert entries and all(e.backend == "llama.cpp" and e.path.suffix == ".gguf" for e in entries)


@pytest.mark.parametrize("content", ["def add(a, b):", "for i in range(10):"])
def test_speculative_chat_gives_the_standard_text_and_both_are_audited(
    server: Server, content: str
) -> None:
    std = server.chat(content, max_tokens=24, temperature=0, decoding={"mode": "standard"})
    spec = server.chat(
        content, max_tokens=24, temperature=0,
        decoding={"mode": "speculative", "proposer": "draft", "k": 4},
    )  # fmt: skip
    assert std.status_code == spec.status_code == 200, (std.text, spec.text)
    assert std.headers["x-decoding-mode"] == "standard"
    assert spec.headers["x-decoding-mode"] == "speculative"
    text = std.json()["choices"][0]["message"]["content"]
    assert std.json()["usage"]["completion_tokens"] == 24 and text
    assert spec.json()["choices"][0]["message"]["content"] == text
    details = spec.json()["usage"]["completion_tokens_details"]
    drafted = details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"]
    assert drafted > 0  # the draft proposed, the target verified

    entries = {(e.name, e.version): e for e in load_manifest(server.manifest).entries}
    target = entries[(MODEL, "1")]
    a = server.record(std.headers["x-request-id"])
    b = server.record(spec.headers["x-request-id"])
    for rec in (a, b):
        assert rec["status"] == 200 and rec["completion_tokens"] == 24
        assert (rec["target_model"], rec["target_version"]) == (target.name, target.version)
        assert rec["target_sha256"] == target.sha256 == sha256(target.path)  # the GGUF's
    assert a["mode"] == "standard" and a["draft_model"] is None
    assert b["mode"] == "speculative" and b["proposer"] == "draft"
    draft = entries[(b["draft_model"], b["draft_version"])]
    assert draft.backend == "llama.cpp" and b["draft_sha256"] == draft.sha256
    assert b["accepted_tokens"] == details["accepted_prediction_tokens"]


def test_a_rejecting_draft_still_gives_the_standard_text(server: Server) -> None:
    """Not a vacuous equality: over several prompts the (random) draft's proposals are
    rejected too, so the target rolled back its sequences and the text is still standard's."""
    rejected = 0
    for content in ("class Point:", "import json", "print(", "héllo"):
        std = server.chat(content, max_tokens=16, temperature=0, decoding={"mode": "standard"})
        spec = server.chat(
            content, max_tokens=16, temperature=0,
            decoding={"mode": "speculative", "proposer": "draft", "k": 4},
        )  # fmt: skip
        assert spec.status_code == 200, spec.text
        got = spec.json()["choices"][0]["message"]["content"]
        assert got == std.json()["choices"][0]["message"]["content"], content
        rejected += spec.json()["usage"]["completion_tokens_details"]["rejected_prediction_tokens"]
    assert rejected > 0
