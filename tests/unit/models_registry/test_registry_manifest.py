from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from registry_fixtures import BASE_VOCAB, MakeModel, write_model

from models_registry.compat import check_tokenizer_compatible, first_difference
from models_registry.errors import IncompatibleDraft, IntegrityError, ManifestError, ModelNotFound
from models_registry.manifest import (
    Manifest,
    ModelEntry,
    NewVersion,
    dump_manifest,
    load_manifest,
    register,
    verify_sha256,
)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(folder: Path, models: list[dict[str, object]]) -> Path:
    path = folder / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": models}, sort_keys=False))
    return path


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A manifest shaped like the demo one: target v1, draft v1 and v2, relative paths."""
    folder = tmp_path / "registry"
    entries = []
    for name, version, role, seed in (
        ("demo-code-target", "1", "target", 0),
        ("demo-code-draft", "1", "draft", 1),
        ("demo-code-draft", "2", "draft", 2),
    ):
        rel = f"{name}-v{version}"
        write_model(folder / rel, seed=seed)
        entry: dict[str, object] = {
            "name": name,
            "version": version,
            "role": role,
            "path": rel,
            "sha256": sha(folder / rel / "model.safetensors"),
            "architecture": "LlamaForCausalLM",
            "layers": 1,
            "hidden": 8,
            "parameters": 208,
            "tokenizer": "demo-bpe-8k",
            "dtype": "float16",
            "trained_on": "unit tests",
        }
        if role == "draft":
            entry["target"] = "demo-code-target"
        entries.append(entry)
    return write_manifest(folder, entries)


def test_load_resolves_paths_and_lookups(demo: Path) -> None:
    manifest = load_manifest(demo)
    assert [e.key for e in manifest.entries] == [
        "demo-code-target@1",
        "demo-code-draft@1",
        "demo-code-draft@2",
    ]
    for entry in manifest.entries:
        assert entry.path.is_absolute()
        assert entry.path == (demo.parent / f"{entry.name}-v{entry.version}").resolve()
    assert [e.key for e in manifest.targets()] == ["demo-code-target@1"]
    assert [e.version for e in manifest.drafts_for("demo-code-target")] == ["1", "2"]
    assert manifest.drafts_for("other") == ()
    assert manifest.get("demo-code-draft").version == "2"  # newest
    assert manifest.get("demo-code-draft", "1").target == "demo-code-target"
    assert manifest.get("demo-code-target").parameters == 208
    with pytest.raises(ModelNotFound, match="demo-code-draft@9"):
        manifest.get("demo-code-draft", "9")
    with pytest.raises(ModelNotFound, match="'nope'"):
        manifest.get("nope")


def test_version_numbers_in_yaml_become_strings_and_sort_naturally(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    models: list[dict[str, object]] = []
    for version in (2, 10):
        write_model(folder / f"t{version}")
        models.append(
            {
                "name": "t",
                "version": version,
                "role": "target",
                "path": f"t{version}",
                "sha256": sha(folder / f"t{version}" / "model.safetensors"),
            }
        )
    manifest = load_manifest(write_manifest(folder, models))
    assert manifest.versions("t") == ("2", "10")
    assert manifest.get("t").version == "10"


def test_verify_sha256_ok_and_mismatch(demo: Path) -> None:
    manifest = load_manifest(demo)
    for entry in manifest.entries:
        verify_sha256(entry)
    entry = manifest.get("demo-code-draft", "2")
    weights = entry.path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as err:
        verify_sha256(entry)
    message = str(err.value)
    assert message.startswith("demo-code-draft@2: sha256 mismatch: manifest says ")
    assert entry.sha256[:12] in message
    assert sha(weights)[:12] in message


def test_missing_directory_is_model_not_found(demo: Path, tmp_path: Path) -> None:
    entry = load_manifest(demo).get("demo-code-target")
    gone = ModelEntry(**{**entry.__dict__, "path": tmp_path / "gone"})
    with pytest.raises(ModelNotFound, match="does not exist"):
        verify_sha256(gone)
    (entry.path / "model.safetensors").unlink()
    with pytest.raises(ModelNotFound, match="safetensors"):
        verify_sha256(entry)


def test_sharded_weights_hash_in_name_order(tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"second")
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"first")
    expected = hashlib.sha256(b"firstsecond").hexdigest()
    entry = ModelEntry("m", "1", "target", folder, expected)
    verify_sha256(entry)
    with pytest.raises(IntegrityError):
        verify_sha256(ModelEntry("m", "1", "target", folder, hashlib.sha256(b"x").hexdigest()))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, "unknown field 'colour'"),
        ({"target": None}, "must name its 'target'"),
        ({"target": "ghost"}, "'ghost' is not a target"),
        ({"role": "oracle"}, "role must be"),
        ({"sha256": "abc"}, "64 lowercase hex"),
        ({"parameters": "many"}, "'parameters' must be an integer"),
        ({"path": None}, "missing required field 'path'"),
    ],
)
def test_malformed_draft_entry_is_rejected(demo: Path, change: dict, message: str) -> None:
    data = yaml.safe_load(demo.read_text())
    data["models"][1].update(change)
    demo.write_text(yaml.safe_dump(data))
    with pytest.raises(ManifestError, match=message):
        load_manifest(demo)


def test_duplicate_entries_and_bad_top_level(demo: Path) -> None:
    data = yaml.safe_load(demo.read_text())
    demo.write_text(yaml.safe_dump({"models": [*data["models"], data["models"][2]]}))
    with pytest.raises(ManifestError, match="demo-code-draft@2: listed twice"):
        load_manifest(demo)
    demo.write_text("targets: []\n")
    with pytest.raises(ManifestError, match="'models:'"):
        load_manifest(demo)
    with pytest.raises(ModelNotFound):
        load_manifest(demo.parent / "absent.yaml")


def test_tokenizers_equal_pass(make_model: MakeModel) -> None:
    info = check_tokenizer_compatible(make_model("draft", seed=1), make_model("target"))
    assert info.vocab_size == len(BASE_VOCAB)
    assert info.fingerprint.startswith("sha256:")


def test_swapped_token_ids_are_named(make_model: MakeModel) -> None:
    swapped = list(BASE_VOCAB)
    swapped[6], swapped[7] = swapped[7], swapped[6]  # 'self' <-> 'import'
    with pytest.raises(IncompatibleDraft) as err:
        check_tokenizer_compatible(make_model("draft", vocab=swapped), make_model("target"))
    assert "token 'self' is id 6 in target but id 7 in draft" in str(err.value)


def test_extra_or_missing_token_is_named(make_model: MakeModel) -> None:
    target = make_model("target")
    with pytest.raises(IncompatibleDraft, match=r"vocab size 11 vs 10.*'lambda' \(id 10 in draft"):
        check_tokenizer_compatible(make_model("big", vocab=[*BASE_VOCAB, "lambda"]), target)
    with pytest.raises(IncompatibleDraft, match=r"'y' \(id 9 in target\) is missing"):
        check_tokenizer_compatible(make_model("small", vocab=BASE_VOCAB[:-1]), target)


def test_logits_width_mismatch(make_model: MakeModel) -> None:
    with pytest.raises(IncompatibleDraft, match="logits width"):
        check_tokenizer_compatible(make_model("d", config_vocab=16), make_model("t"))


def test_first_difference_none_when_equal() -> None:
    assert first_difference({"a": 0, "b": 1}, {"b": 1, "a": 0}) is None


def test_register_target_then_draft_and_round_trip(make_model: MakeModel, tmp_path: Path) -> None:
    manifest = Manifest(entries=(), root=tmp_path / "models")
    target_dir = make_model("t", layers=2, hidden=8)
    target = register(
        manifest, target_dir, NewVersion("code-target", "1", "target", tokenizer="bpe-10")
    )
    assert target.sha256 == sha(target_dir / "model.safetensors")
    assert target.parameters == 10 * 8 + 2 * (16 * 8)  # from the safetensors header
    assert (target.architecture, target.layers, target.hidden, target.dtype) == (
        "LlamaForCausalLM",
        2,
        8,
        "float16",
    )
    manifest = manifest.with_entry(target)

    draft = register(
        manifest, make_model("d", seed=3), NewVersion("code-draft", "1", "draft", "code-target")
    )
    assert (draft.version, draft.target, draft.tokenizer) == ("1", "code-target", "bpe-10")
    manifest = manifest.with_entry(draft)
    path = tmp_path / "models" / "manifest.yaml"
    dump_manifest(manifest, path)
    assert "path: d\n" in path.read_text()  # written relative to the manifest's folder
    assert load_manifest(path) == manifest
    with pytest.raises(ManifestError, match="already registered"):
        register(manifest, target_dir, NewVersion("code-target", "1", "target"))


def test_register_rejects_incompatible_or_orphan_draft(
    make_model: MakeModel, tmp_path: Path
) -> None:
    target = register(Manifest((), tmp_path), make_model("t"), NewVersion("t", "1", "target"))
    manifest = Manifest((target,), tmp_path)
    other = make_model("other", vocab=[*BASE_VOCAB[:-1], "z"])
    with pytest.raises(IncompatibleDraft, match="'y'"):
        register(manifest, other, NewVersion("d", "1", "draft", "t"))
    with pytest.raises(ManifestError, match="must name its target"):
        register(manifest, make_model("d"), NewVersion("d", "1", "draft"))
    with pytest.raises(ModelNotFound):
        register(manifest, make_model("d2"), NewVersion("d", "1", "draft", "no-such-target"))
    with pytest.raises(ModelNotFound):
        register(manifest, tmp_path / "nowhere", NewVersion("d", "1", "draft", "t"))


def test_parameter_count_matches_a_saved_transformers_model(tmp_path: Path) -> None:
    """Tied embeddings are stored once, so the header count equals model.parameters()."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(BASE_VOCAB),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    folder = write_model(tmp_path / "hf")  # tokenizer files; weights replaced below
    model.half().save_pretrained(folder, safe_serialization=True)
    entry = register(Manifest((), tmp_path), folder, NewVersion("hf", "1", "target"))
    assert entry.parameters == sum(p.numel() for p in model.parameters())
    assert (entry.architecture, entry.layers, entry.hidden, entry.dtype) == (
        "LlamaForCausalLM",
        2,
        16,
        "float16",
    )
