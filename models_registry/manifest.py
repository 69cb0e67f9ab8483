"""The model manifest: which target and draft versions exist, where, and their hashes.

``manifest.yaml`` holds a ``models:`` list; each entry's ``path`` is relative to the
manifest's folder (absolute paths are kept). After loading, every ``ModelEntry.path`` is
absolute. Drafts name their target by model name; a draft fits every version of it that
shares its tokenizer.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from models_registry.compat import check_tokenizer_compatible, read_tokenizer
from models_registry.errors import IntegrityError, ManifestError, ModelNotFound
from models_registry.weights import read_config, sha256_files, weight_files, weights_info

Role = Literal["target", "draft"]
ROLES: tuple[Role, ...] = ("target", "draft")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REQUIRED = ("name", "version", "role", "path", "sha256")
_OPTIONAL_STR = ("architecture", "tokenizer", "dtype", "trained_on", "target")
_OPTIONAL_INT = ("parameters", "layers", "hidden")
TOOL_FORMATS: tuple[str, ...] = (
    "hermes", "llama3_json", "mistral", "mistral_v11", "granite", "pythonic", "harmony",
)  # fmt: skip
"""The tool-call syntaxes a target may be declared to speak (``tool_format``; the engine's
gateway/engine/constraints/tool_formats.py defines them). Unset: read off the chat template."""
BACKENDS: tuple[str, ...] = ("torch", "llama.cpp")
"""What runs a model (``backend``): ``torch`` (transformers, the default) on a directory of
safetensors, ``llama.cpp`` on one GGUF file (gateway/engine/backends/)."""
KINDS: tuple[str, ...] = ("model", "head")
"""What a version is (``kind``): ``model``, a causal LM (the default); ``head``, a
feature-conditioned draft head (head_config.json and head.safetensors, models_registry/heads),
which drafts from its target's hidden states with its target's embeddings and output head: a
draft only, rolled out like any draft."""
_OPTIONAL_CHOICE: dict[str, tuple[str, ...]] = {
    "tool_format": TOOL_FORMATS, "backend": BACKENDS, "kind": KINDS,
}  # fmt: skip


@dataclass(frozen=True)
class ModelEntry:
    """One model version in the manifest."""

    name: str
    version: str
    role: Role
    path: Path
    """Directory holding config.json, tokenizer files and *.safetensors (absolute once loaded);
    for the llama.cpp backend, the .gguf file, its tokenizer files in the same folder."""
    sha256: str
    """SHA-256 of model.safetensors (or of all shards' bytes concatenated in name order; or of
    the .gguf file)."""
    architecture: str | None = None
    parameters: int | None = None
    tokenizer: str | None = None
    target: str | None = None
    """For drafts: the target model name this draft proposes for."""
    layers: int | None = None
    hidden: int | None = None
    dtype: str | None = None
    trained_on: str | None = None
    tool_format: str | None = None
    """The model's tool-call syntax (one of TOOL_FORMATS); None: read off its chat template."""
    backend: str | None = None
    """One of BACKENDS; None: torch."""
    kind: str | None = None
    """One of KINDS; None: model."""

    @property
    def key(self) -> str:
        """``name@version``, the form used in messages and logs."""
        return f"{self.name}@{self.version}"

    def to_dict(self, relative_to: Path | None = None) -> dict[str, Any]:
        """Manifest-shaped dict (None fields dropped); path made relative when possible."""
        path = self.path
        if relative_to is not None and path.is_relative_to(relative_to):
            path = path.relative_to(relative_to)
        out: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "role": self.role,
            "path": str(path),
            "sha256": self.sha256,
        }
        for key in (*_OPTIONAL_STR, *_OPTIONAL_INT, *_OPTIONAL_CHOICE):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


def version_key(version: str) -> tuple[tuple[int, str], ...]:
    """Natural order: "2" < "10", "1.9" < "1.10"; non-numeric parts compare as text."""
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.\-_]", version))


@dataclass(frozen=True)
class Manifest:
    """All registered model versions, in file order."""

    entries: tuple[ModelEntry, ...]
    root: Path
    """The manifest's folder: relative paths resolve against it."""

    def targets(self) -> tuple[ModelEntry, ...]:
        return tuple(e for e in self.entries if e.role == "target")

    def drafts(self) -> tuple[ModelEntry, ...]:
        return tuple(e for e in self.entries if e.role == "draft")

    def drafts_for(self, target: str) -> tuple[ModelEntry, ...]:
        """Drafts whose ``target`` is this target name, oldest version first."""
        found = [e for e in self.drafts() if e.target == target]
        return tuple(sorted(found, key=lambda e: version_key(e.version)))

    def versions(self, name: str) -> tuple[str, ...]:
        found = [e.version for e in self.entries if e.name == name]
        return tuple(sorted(found, key=version_key))

    def get(self, name: str, version: str | None = None) -> ModelEntry:
        """The entry ``name@version``, or the newest version of ``name`` when version is None."""
        matches = [e for e in self.entries if e.name == name]
        if not matches:
            known = ", ".join(sorted({e.name for e in self.entries})) or "none"
            raise ModelNotFound(f"model {name!r} is not in the manifest (known: {known})")
        if version is None:
            return max(matches, key=lambda e: version_key(e.version))
        for entry in matches:
            if entry.version == str(version):
                return entry
        have = ", ".join(self.versions(name))
        raise ModelNotFound(f"{name}@{version} is not in the manifest (versions: {have})")

    def with_entry(self, entry: ModelEntry) -> Manifest:
        """A new manifest with ``entry`` appended; duplicates and dangling targets rejected."""
        return Manifest(entries=_validated((*self.entries, entry)), root=self.root)

    def to_dict(self) -> dict[str, Any]:
        return {"models": [e.to_dict(relative_to=self.root) for e in self.entries]}


def _entry_from_dict(raw: object, root: Path, index: int) -> ModelEntry:
    where = f"models[{index}]"
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where}: expected a mapping, got {type(raw).__name__}")
    where = f"models[{index}] ({raw.get('name', '?')}@{raw.get('version', '?')})"
    unknown = sorted(set(raw) - {*_REQUIRED, *_OPTIONAL_STR, *_OPTIONAL_INT, *_OPTIONAL_CHOICE})
    if unknown:
        raise ManifestError(f"{where}: unknown field {unknown[0]!r}")
    for key in _REQUIRED:
        if raw.get(key) in (None, ""):
            raise ManifestError(f"{where}: missing required field {key!r}")
    fields: dict[str, Any] = {k: str(raw[k]) for k in _REQUIRED}
    for key in _OPTIONAL_STR:
        fields[key] = None if raw.get(key) is None else str(raw[key])
    for key in _OPTIONAL_INT:
        value = raw.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ManifestError(f"{where}: field {key!r} must be an integer, got {value!r}")
        fields[key] = value
    for key, choices in _OPTIONAL_CHOICE.items():
        value = raw.get(key)
        if value is not None and value not in choices:
            raise ManifestError(
                f"{where}: field {key!r} must be one of {', '.join(choices)}, got {value!r}"
            )
        fields[key] = value
    path = Path(fields.pop("path")).expanduser()
    if fields["backend"] == "llama.cpp" and path.suffix != ".gguf":
        raise ManifestError(f"{where}: backend llama.cpp serves a .gguf file, got path {path}")
    return ModelEntry(path=(root / path).resolve(), **fields)


def _validated(entries: tuple[ModelEntry, ...]) -> tuple[ModelEntry, ...]:
    seen: set[str] = set()
    target_names = {e.name for e in entries if e.role == "target"}
    for e in entries:
        if e.role not in ROLES:
            raise ManifestError(f"{e.key}: role must be 'target' or 'draft', got {e.role!r}")
        if not _SHA256.match(e.sha256):
            raise ManifestError(f"{e.key}: sha256 must be 64 lowercase hex digits")
        if e.key in seen:
            raise ManifestError(f"{e.key}: listed twice")
        seen.add(e.key)
        if e.role == "draft" and not e.target:
            raise ManifestError(f"{e.key}: a draft must name its 'target'")
        if e.role == "target" and e.target:
            raise ManifestError(f"{e.key}: a target must not name a 'target'")
        if e.role == "draft" and e.target not in target_names:
            raise ManifestError(f"{e.key}: target {e.target!r} is not a target in the manifest")
        if e.kind == "head" and e.role != "draft":
            raise ManifestError(f"{e.key}: a head drafts for a target: its role is 'draft'")
    return entries


def load_manifest(path: str | Path) -> Manifest:
    """Parse and validate a manifest file; entry paths become absolute."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFound(f"manifest {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("models"), list):
        raise ManifestError(f"{path}: expected a top-level 'models:' list")
    root = path.parent.resolve()
    entries = tuple(_entry_from_dict(raw, root, i) for i, raw in enumerate(data["models"]))
    return Manifest(entries=_validated(entries), root=root)


def dump_manifest(manifest: Manifest, path: str | Path) -> None:
    """Write ``manifest`` as YAML; paths under the manifest's root are written relative."""
    text = yaml.safe_dump(manifest.to_dict(), sort_keys=False)
    Path(path).write_text(text, encoding="utf-8")


def verify_sha256(entry: ModelEntry, cache: Path | None = None) -> None:
    """Hash the entry's weights; raise IntegrityError on mismatch, ModelNotFound if absent.

    ``cache``: a JSON file of weights already verified (in the gateway's var dir), keyed by
    each weight file's resolved path, size, inode, device, and modification and change times
    in nanoseconds. Weights whose files all stat as they did when they last hashed to
    ``entry.sha256`` are not read again, so a restart does not hash gigabytes of unchanged
    shards. Writing to a file moves its change time, which no user can set back, so changed
    weights are hashed again; only a match is kept, and an unreadable cache is ignored."""
    files = entry_files(entry)
    key = _stat_key(files) if cache is not None else ""
    if cache is not None and _read_checksums(cache).get(key) == entry.sha256:
        return
    actual = sha256_files(files)
    if actual != entry.sha256:
        raise IntegrityError(
            f"{entry.key}: sha256 mismatch: manifest says {entry.sha256[:12]}..., "
            f"file has {actual[:12]}... ({entry.path})"
        )
    if cache is not None and _stat_key(files) == key:  # not written to while hashed
        _keep_checksum(cache, key, actual)


def entry_files(entry: ModelEntry) -> tuple[Path, ...]:
    """The files the entry's checksum covers: its safetensors, or its GGUF file."""
    if entry.backend == "llama.cpp":
        if not entry.path.is_file():
            raise ModelNotFound(f"GGUF file {entry.path} does not exist")
        return (entry.path,)
    return weight_files(entry.path)


def _stat_key(files: tuple[Path, ...]) -> str:
    """What identifies the files' contents without reading them (see verify_sha256)."""
    stats = []
    for path in files:
        st = path.stat()
        stats.append([str(path.resolve()), st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns,
                      st.st_ctime_ns])  # fmt: skip
    return json.dumps(stats)


def _read_checksums(cache: Path) -> dict[str, str]:
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _still_valid(key: str) -> bool:
    try:
        return _stat_key(tuple(Path(f[0]) for f in json.loads(key))) == key
    except (OSError, ValueError, TypeError, IndexError):
        return False


def _keep_checksum(cache: Path, key: str, digest: str) -> None:
    """Add a verified key (keys whose files changed or went are dropped), written whole to
    a file of its own and renamed over the cache: a reader sees the old file or the new."""
    kept = {k: v for k, v in _read_checksums(cache).items() if k != key and _still_valid(k)}
    kept[key] = digest
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{cache.name}.", dir=cache.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(kept, f, indent=1, sort_keys=True)
        os.replace(tmp, cache)
    except OSError:  # served all the same; the next start hashes again
        pass


@dataclass(frozen=True)
class NewVersion:
    """A model version to register: its name, version and role, the target a draft drafts
    for, and optional labels (the tokenizer's, what it was trained on)."""

    name: str
    version: str
    role: Role
    target: str | None = None
    tokenizer: str | None = None
    trained_on: str | None = None


def register(manifest: Manifest, model_dir: str | Path, new: NewVersion) -> ModelEntry:
    """Describe a local model directory as a new entry (not yet added: see ``with_entry``).

    Hashes the weights, counts parameters from the safetensors headers, reads the
    architecture from config.json and, for drafts, checks the tokenizer against the newest
    version of ``new.target``. The tokenizer label defaults to the target's label (drafts) or
    the tokenizer's fingerprint.
    """
    name, role, target, tokenizer = new.name, new.role, new.target, new.tokenizer
    version = new.version
    model_dir = Path(model_dir).expanduser().resolve()
    version = str(version)
    if role not in ROLES:
        raise ManifestError(f"{name}@{version}: role must be 'target' or 'draft', got {role!r}")
    if any(e.name == name and e.version == version for e in manifest.entries):
        raise ManifestError(f"{name}@{version}: already registered")
    if (model_dir / HEAD_CONFIG).is_file():
        return _register_head(manifest, model_dir, new)
    config = read_config(model_dir) if model_dir.is_dir() else None
    weights = weights_info(model_dir)  # raises ModelNotFound for a missing dir / weights
    if config is None or config.architecture is None:
        raise ModelNotFound(f"{model_dir}: config.json with 'architectures' is required")
    label = tokenizer
    if role == "draft":
        if not target:
            raise ManifestError(f"{name}@{version}: a draft must name its target")
        target_entry = manifest.get(target)
        if target_entry.role != "target":
            raise ManifestError(f"{name}@{version}: {target_entry.key} is not a target")
        shared = check_tokenizer_compatible(model_dir, target_entry.path)
        label = label or target_entry.tokenizer or shared.fingerprint
    elif target:
        raise ManifestError(f"{name}@{version}: a target must not name a 'target'")
    if label is None:
        label = read_tokenizer(model_dir).fingerprint
    return ModelEntry(
        name=name,
        version=version,
        role=cast(Role, role),
        path=model_dir,
        sha256=sha256_files(weights.files),
        architecture=config.architecture,
        parameters=weights.parameters,
        tokenizer=label,
        target=target if role == "draft" else None,
        layers=config.layers,
        hidden=config.hidden,
        dtype=weights.dtype,
        trained_on=new.trained_on,
    )


HEAD_CONFIG = "head_config.json"  # a head directory (gateway/feature_head.py CONFIG_FILE)


def _register_head(manifest: Manifest, model_dir: Path, new: NewVersion) -> ModelEntry:
    """A head directory as a draft entry of kind ``head``: it uses its target's tokenizer
    (the newest version of ``new.target``), whose layer count and width it was trained on."""
    where = f"{new.name}@{new.version}"
    if new.role != "draft" or not new.target:
        raise ManifestError(f"{where}: a head is a draft and must name its target")
    target_entry = manifest.get(new.target)
    if target_entry.role != "target":
        raise ManifestError(f"{where}: {target_entry.key} is not a target")
    head = json.loads((model_dir / HEAD_CONFIG).read_text())
    weights = weights_info(model_dir)
    if target_entry.layers is not None and head.get("target_layers") != target_entry.layers:
        raise ManifestError(
            f"{where}: the head reads a target of {head.get('target_layers')} layers, "
            f"{target_entry.key} has {target_entry.layers}"
        )
    return ModelEntry(
        name=new.name, version=str(new.version), role="draft", path=model_dir,
        sha256=sha256_files(weights.files), architecture="FeatureHead",
        parameters=weights.parameters, tokenizer=new.tokenizer or target_entry.tokenizer,
        target=new.target, layers=1, hidden=head.get("hidden"), dtype=weights.dtype,
        trained_on=new.trained_on, kind="head",
    )  # fmt: skip


__all__ = [
    "BACKENDS",
    "KINDS",
    "ROLES",
    "Manifest",
    "ModelEntry",
    "NewVersion",
    "Role",
    "dump_manifest",
    "entry_files",
    "load_manifest",
    "register",
    "verify_sha256",
    "version_key",
]
