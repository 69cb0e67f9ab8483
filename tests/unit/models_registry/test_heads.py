"""Draft heads in the registry: `python -m models_registry heads train` trains one for a
target (seeded, resumable: a run cut in chunks ends where an uninterrupted one does), the
result registers as a draft of kind `head` (checksummed like any draft) and the model pool
loads it as a draft version, which then decodes exactly; bad entries and tampered weights
are refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from gateway.engine import DecodeRequest, SamplingParams
from gateway.serving.models import ModelPool, PoolOptions
from models_registry.errors import IntegrityError, ManifestError
from models_registry.heads.cli import main as heads_main
from models_registry.manifest import (
    NewVersion,
    dump_manifest,
    load_manifest,
    register,
    verify_sha256,
)  # fmt: skip
from tests.integration import tiny_models


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return tiny_models.build(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    lines = [{"text": t} for t in tiny_models.CORPUS] + [{"prompt": "def f(", "completion": "x):"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def train(models: Path, data: Path, out: Path, *extra: str) -> int:
    target = models.parent / "tiny-target-v1"
    args = ["train", "--target", str(target), "--data", str(data), "--out", str(out),
            "--steps", "3", "--batch", "2", "--seq", "12", "--ttt", "2", "--quiet",
            *extra]  # fmt: skip
    return heads_main(args)


def weights(out: Path) -> dict:
    return load_file(str(out / "head.safetensors"))


def test_training_is_seeded_and_resumes_where_it_stopped(models, data, tmp_path) -> None:
    straight, chunked, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert train(models, data, straight) == 0
    assert train(models, data, chunked, "--chunk", "1") == 0
    assert not (chunked / "head.safetensors").exists()  # 1 of 3 steps: not finished
    assert (tmp_path / "b.work" / "checkpoint.pt").exists()
    assert train(models, data, chunked) == 0  # resumes at step 1
    a, b = weights(straight), weights(chunked)
    assert a.keys() == b.keys()
    assert all(bool((a[k] == b[k]).all()) for k in a)
    assert train(models, data, other, "--seed", "1") == 0  # the control: another seed
    c = weights(other)
    assert any(not bool((a[k] == c[k]).all()) for k in a)
    log = json.loads((straight / "train_log.json").read_text())
    assert log["steps"] == 3 and log["ttt"] == 2 and len(log["last_agree"]) == 2


def test_bad_arguments_are_refused(models, data, tmp_path, capsys) -> None:
    assert train(models, data, tmp_path / "x", "--steps", "0") == 2
    assert "--steps must be >= 1" in capsys.readouterr().err


async def inline(fn: Callable[[], object]) -> object:
    return fn()


async def test_a_head_registers_and_serves_as_a_draft_version(models, data, tmp_path) -> None:
    out = tmp_path / "head"
    assert train(models, data, out) == 0
    manifest = load_manifest(models)
    new = NewVersion(name="tiny-draft", version="3", role="draft", target="tiny-target")
    entry = register(manifest, out, new)
    assert entry.kind == "head" and entry.role == "draft" and entry.architecture == "FeatureHead"
    verify_sha256(entry)
    path = models.parent / "with-head.yaml"
    dump_manifest(manifest.with_entry(entry), path)
    reloaded = load_manifest(path)
    assert reloaded.get("tiny-draft", "3").kind == "head"
    pool = ModelPool(reloaded, inline, PoolOptions(device="cpu"))
    handle = await pool.draft("tiny-target", "3")
    _, engine = await pool.target("tiny-target")
    prompt = tuple(engine.tokenizer("def add(a, b):")["input_ids"])
    sp = SamplingParams(temperature=0.0, max_tokens=12)
    standard = engine.run(DecodeRequest(prompt, sp))
    spec = {"mode": "speculative", "proposer": "draft", "k_min": 3, "k_max": 3}
    res = engine.run(DecodeRequest(prompt, sp, **spec), draft=handle.model)
    assert res.token_ids == standard.token_ids
    assert res.stats.drafted > 0 and res.stats.proposer == "draft"
    # Tampered weights are refused like a draft's.
    (out / "head.safetensors").write_bytes((out / "head.safetensors").read_bytes()[:-1] + b"\0")
    with pytest.raises(IntegrityError):
        verify_sha256(reloaded.get("tiny-draft", "3"))


def test_a_head_must_be_a_draft(models, tmp_path) -> None:
    raw = load_manifest(models).to_dict()
    raw["models"][1]["kind"] = "head"
    raw["models"][0]["kind"] = "head"  # the target
    path = models.parent / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ManifestError, match="role is 'draft'"):
        load_manifest(path)
    raw["models"][0]["kind"] = "adapter"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ManifestError, match="kind"):
        load_manifest(path)


DOC = Path(__file__).resolve().parents[3] / "docs" / "heads.md"


def test_the_docs_commands_are_the_commands_the_cli_takes() -> None:
    """docs/heads.md's `heads` commands parse (its training settings are the demo head's)."""
    from models_registry.heads.cli import build_parser

    text = DOC.read_text()
    commands = [
        block.replace("\\\n", " ").split()
        for block in text.split("```bash\n")[1:]
        if block.startswith("python -m models_registry heads")
    ]
    commands = [c[: c.index("```")] if "```" in c else c for c in commands]
    assert {c[4] for c in commands} == {"corpus", "generate", "train", "eval"}
    for c in commands:
        build_parser().parse_args(c[4:])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--target", "x"])  # the control: --data missing
