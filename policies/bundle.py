"""Policy bundles: reading YAML, validating, merging tenants over the default, the revision.

A bundle directory holds `default.yaml` (complete) and `tenants/<tenant>.yaml` (partial, deep
merged over the default: objects merge key by key, lists and scalars replace, `auto.ewma`
replaces whole). Any problem raises `PolicyError` naming the file, the JSON path and what is
wrong; nothing is half-loaded.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from jsonschema import Draft202012Validator

from policies.document import TenantPolicy, parse_policy, semantic_problems
from policies.schema import (
    ATOMIC_PATHS,
    DEFAULT_VALIDATOR,
    TENANT_VALIDATOR,
    schema_problems,
)

DEFAULT_FILE = "default.yaml"
TENANTS_DIR = "tenants"
TENANT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
REVISION_HEX_CHARS = 12


@dataclass(frozen=True)
class Problem:
    file: str
    """Bundle-relative file name, e.g. "tenants/acme.yaml"."""
    path: str
    """JSON path inside the document, e.g. "speculation.k.max"."""
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.path}: {self.message}"


class PolicyError(Exception):
    """A policy document or bundle was refused. `str()` lists every problem, one a line."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def tenant_file(tenant_id: str) -> str:
    return f"{TENANTS_DIR}/{tenant_id}.yaml"


@dataclass(frozen=True)
class PolicyBundle:
    """A validated, immutable set of policy documents.

    `revision` is the content hash (sha256 of the canonical JSON of default + tenants, first
    12 hex digits); `version` is set by `PolicyStore` on activation (0 = never activated).
    """

    default: Mapping[str, Any]
    tenants: Mapping[str, Mapping[str, Any]]
    revision: str
    version: int = 0
    _default_policy: TenantPolicy | None = field(default=None, repr=False, compare=False)
    _policies: Mapping[str, TenantPolicy] = field(
        default_factory=lambda: MappingProxyType({}), repr=False, compare=False
    )

    def policy_for(self, tenant_id: str) -> TenantPolicy:
        """The tenant's effective policy; tenants without a document get the default."""
        policy = self._policies.get(tenant_id, self._default_policy)
        assert policy is not None, "PolicyBundle must be built by build_bundle"
        return policy

    def effective_document(self, tenant_id: str) -> dict[str, Any]:
        """The merged document (plain, JSON-serialisable) that `policy_for` was parsed from."""
        return deep_merge(thaw(self.default), thaw(self.tenants.get(tenant_id, {})))

    def to_dict(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "version": self.version,
            "default": thaw(self.default),
            "tenants": {t: thaw(d) for t, d in sorted(self.tenants.items())},
        }


def build_bundle(
    default_doc: object, tenant_docs: Mapping[str, object], *, version: int = 0
) -> PolicyBundle:
    """Validate every document, merge each tenant over the default, compute the revision."""
    problems = _document_problems(DEFAULT_FILE, default_doc, DEFAULT_VALIDATOR)
    if not problems:
        assert isinstance(default_doc, dict)
        problems += [Problem(DEFAULT_FILE, p, m) for p, m in semantic_problems(default_doc)]
    default_ok = not problems
    policies: dict[str, TenantPolicy] = {}
    for tenant_id, doc in sorted(tenant_docs.items()):
        label = tenant_file(tenant_id)
        if not TENANT_ID.match(tenant_id):
            problems.append(Problem(label, "(file name)", f"invalid tenant id {tenant_id!r}"))
            continue
        tenant_problems = _document_problems(label, doc, TENANT_VALIDATOR)
        problems += tenant_problems
        if tenant_problems or not default_ok:
            continue
        assert isinstance(doc, dict) and isinstance(default_doc, dict)
        merged = deep_merge(default_doc, doc)
        merged_problems = [Problem(label, p, m) for p, m in semantic_problems(merged)]
        merged_problems += _document_problems(label, merged, DEFAULT_VALIDATOR)
        problems += merged_problems
        if not merged_problems:
            policies[tenant_id] = parse_policy(merged)
    if problems:
        raise PolicyError(problems)
    assert isinstance(default_doc, dict)
    content = {"default": default_doc, "tenants": dict(tenant_docs)}
    return PolicyBundle(
        default=freeze(default_doc),
        tenants=MappingProxyType({t: freeze(d) for t, d in sorted(tenant_docs.items())}),
        revision=content_revision(content),
        version=version,
        _default_policy=parse_policy(default_doc),
        _policies=MappingProxyType(policies),
    )


def load_bundle_dir(path: str | Path) -> PolicyBundle:
    """Read `<path>/default.yaml` and `<path>/tenants/*.yaml` and build a bundle."""
    root = Path(path)
    problems: list[Problem] = []
    default_doc: object = None
    try:
        default_doc = read_yaml(root / DEFAULT_FILE, DEFAULT_FILE)
    except PolicyError as exc:
        problems += exc.problems
    tenant_docs: dict[str, object] = {}
    tenants_dir = root / TENANTS_DIR
    if tenants_dir.is_dir():
        for file in sorted(tenants_dir.iterdir()):
            label = f"{TENANTS_DIR}/{file.name}"
            if file.suffix not in (".yaml", ".yml"):
                problems.append(Problem(label, "(file name)", "not a .yaml file"))
                continue
            if file.stem in tenant_docs:
                problems.append(Problem(label, "(file name)", "tenant defined twice"))
                continue
            try:
                tenant_docs[file.stem] = read_yaml(file, label)
            except PolicyError as exc:
                problems += exc.problems
    if problems:
        raise PolicyError(problems)
    return build_bundle(default_doc, tenant_docs)


def read_yaml(file: Path, label: str) -> object:
    """Parse one YAML document; duplicate keys and syntax errors are PolicyErrors."""
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError([Problem(label, "(file)", f"cannot read: {exc.strerror}")]) from exc
    return parse_yaml(text, label)


def parse_yaml(text: str, label: str) -> object:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        raise PolicyError([Problem(label, where, f"invalid YAML: {exc.problem}")]) from exc
    except yaml.YAMLError as exc:
        raise PolicyError([Problem(label, "(file)", f"invalid YAML: {exc}")]) from exc


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return dict(loader.construct_pairs(node))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _document_problems(label: str, doc: object, validator: Draft202012Validator) -> list[Problem]:
    if doc is None:
        return [Problem(label, "(document)", "is empty; expected a mapping")]
    return [Problem(label, p, m) for p, m in schema_problems(validator, doc)]


def deep_merge(
    base: Mapping[str, Any], overlay: Mapping[str, Any], _path: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Overlay wins; objects merge key by key, lists/scalars and ATOMIC_PATHS replace."""
    out = copy.deepcopy(dict(base))
    for key, value in overlay.items():
        path = (*_path, key)
        old = out.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping) and path not in ATOMIC_PATHS:
            out[key] = deep_merge(old, value, path)
        else:
            out[key] = copy.deepcopy(value)
    return out


def content_revision(content: object) -> str:
    """sha256 of canonical JSON (sorted keys, no whitespace), first 12 hex digits."""
    canonical = json.dumps(thaw(content), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:REVISION_HEX_CHARS]


def freeze(value: Any) -> Any:
    """Deep read-only copy: dicts -> MappingProxyType, lists -> tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Inverse of `freeze`: plain dicts and lists, JSON-serialisable."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value
