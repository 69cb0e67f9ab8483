"""The bundled demo manifest (written by models_registry/demo/train.py) is sound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models_registry.compat import check_tokenizer_compatible
from models_registry.manifest import load_manifest, verify_sha256

DEMO = Path(__file__).resolve().parents[3] / "models_registry" / "demo" / "manifest.yaml"

pytestmark = pytest.mark.skipif(not DEMO.is_file(), reason="demo models not trained yet")


def test_demo_manifest_hashes_and_tokenizers() -> None:
    manifest = load_manifest(DEMO)
    assert [e.name for e in manifest.targets()] == ["demo-code-target"]
    drafts = manifest.drafts_for("demo-code-target")
    assert [d.version for d in drafts] == ["1", "2", "3"]
    target = manifest.get("demo-code-target")
    for entry in manifest.entries:
        verify_sha256(entry)
    for draft in drafts:
        if draft.kind == "head":  # a feature head drafts with the target's tokenizer
            config = json.loads((draft.path / "head_config.json").read_text())
            assert config["target_layers"] == target.layers
            continue
        check_tokenizer_compatible(draft.path, target.path)
    assert [d.version for d in drafts if d.kind == "head"] == ["3"]
