"""`python -m models_registry models entry`: the manifest entry of a local model directory,
offline; what it prints loads as a manifest and passes the gateway's checksum check."""

from __future__ import annotations

import io
from pathlib import Path

from models_registry.cli import main
from models_registry.manifest import load_manifest, verify_sha256

DEMO = Path(__file__).parents[3] / "models_registry" / "demo"


def _entry(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["models", "entry", *args], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_printed_entries_load_and_verify_as_a_manifest(tmp_path: Path) -> None:
    _, target, _ = _entry("--dir", str(DEMO / "demo-code-target-v1"), "--name", "t",
                          "--role", "target")  # fmt: skip
    code, draft, _ = _entry("--dir", str(DEMO / "demo-code-draft-v2"), "--name", "d",
                            "--version", "2", "--role", "draft", "--target", "t")  # fmt: skip
    assert code == 0
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(target + draft.removeprefix("models:\n"))
    loaded = load_manifest(manifest)
    assert [e.key for e in loaded.entries] == ["t@1", "d@2"]
    for e in loaded.entries:
        verify_sha256(e)  # raises IntegrityError on a wrong checksum
    assert loaded.get("d").target == "t" and loaded.get("t").layers == 12


def test_a_draft_needs_its_target_and_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    code, _, err = _entry("--dir", str(DEMO / "demo-code-draft-v2"), "--name", "d",
                          "--role", "draft")  # fmt: skip
    assert code == 1 and "--target" in err
    code, _, err = _entry("--dir", str(tmp_path / "nope"), "--name", "x", "--role", "target")
    assert code == 1 and "does not exist" in err
