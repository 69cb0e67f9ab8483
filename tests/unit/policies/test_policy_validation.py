"""Invalid documents are refused with a message naming the file, the JSON path and the fault."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from policy_helpers import BUNDLES, default_doc

from policies import PolicyError, build_bundle, load_bundle_dir
from policies.bundle import deep_merge
from policies.schema import DEFAULT_SCHEMA, TENANT_SCHEMA

BAD_TENANT_DOCS: list[tuple[str, Any, str, str]] = [
    # (case, document, json path, words in the message)
    (
        "k.max below minimum",
        {"speculation": {"k": {"max": 0}}},
        "speculation.k.max",
        "0 is less than the minimum of 1",
    ),
    (
        "k.min > k.max",
        {"speculation": {"k": {"min": 5, "max": 3}}},
        "speculation.k",
        "min 5 is greater than max 3",
    ),
    (
        "k.min above the default max",
        {"speculation": {"k": {"min": 9}}},
        "speculation.k",
        "min 9 is greater than max 8",
    ),
    (
        "k.max wrong type",
        {"speculation": {"k": {"max": "four"}}},
        "speculation.k.max",
        "'four' is a string, expected integer",
    ),
    (
        "k as a list",
        {"speculation": {"k": [1, 4]}},
        "speculation.k",
        "is an array, expected object",
    ),
    (
        "float where integer",
        {"load": {"shed_queue_depth": 2.5}},
        "load.shed_queue_depth",
        "expected integer",
    ),
    (
        "bool where integer",
        {"speculation": {"min_max_tokens": True}},
        "speculation.min_max_tokens",
        "is a boolean, expected integer",
    ),
    (
        "string where bool",
        {"client_override": {"allow": "yes"}},
        "client_override.allow",
        "expected boolean",
    ),
    ("unknown top-level key", {"modes": "auto"}, "modes", "unknown key"),
    ("unknown nested key", {"auto": {"margn": 0.1}}, "auto.margn", "unknown key"),
    (
        "negative retention",
        {"retention": {"payload_days": -1}},
        "retention.payload_days",
        "-1 is less than the minimum of 0",
    ),
    ("bad mode", {"mode": "fast"}, "mode", "'fast' is not one of: auto, speculative, standard"),
    (
        "bad proposer",
        {"speculation": {"proposers": ["draft", "medusa"]}},
        "speculation.proposers[1]",
        "'medusa' is not one of",
    ),
    (
        "duplicate proposer",
        {"speculation": {"proposers": ["draft", "draft"]}},
        "speculation.proposers",
        "duplicate",
    ),
    (
        "bad enforcement",
        {"determinism": {"enforcement": "warn"}},
        "determinism.enforcement",
        "'warn' is not one of: enforce, dryrun",
    ),
    (
        "bad enforcement on load",
        {"load": {"enforcement": True}},
        "load.enforcement",
        "is not one of: enforce, dryrun",
    ),
    (
        "probe rate above 1",
        {"auto": {"probe_rate": 1.5}},
        "auto.probe_rate",
        "greater than the maximum of 1",
    ),
    ("negative margin", {"auto": {"margin": -0.1}}, "auto.margin", "less than the minimum of 0"),
    (
        "ewma with both",
        {"auto": {"ewma": {"alpha": 0.1, "half_life": 5}}},
        "auto.ewma",
        "exactly one of",
    ),
    ("ewma empty", {"auto": {"ewma": {}}}, "auto.ewma", "exactly one of"),
    ("ewma alpha zero", {"auto": {"ewma": {"alpha": 0}}}, "auto.ewma.alpha", "0"),
    (
        "prior above 1",
        {"auto": {"prior": {"draft": {"acceptance": 1.2}}}},
        "auto.prior.draft.acceptance",
        "greater than the maximum of 1",
    ),
    (
        "prior for unknown proposer",
        {"auto": {"prior": {"medusa": {"acceptance": 0.5}}}},
        "auto.prior.medusa",
        "unknown key",
    ),
    (
        "rate limit zero",
        {"rate_limits": {"requests_per_minute": 0}},
        "rate_limits.requests_per_minute",
        "less than the minimum of 1",
    ),
    (
        "negative token id",
        {"tokens": {"banned_token_ids": [3, -1]}},
        "tokens.banned_token_ids[1]",
        "less than the minimum of 0",
    ),
    (
        "token allowed and banned",
        {"tokens": {"allowed_token_ids": [1, 2], "banned_token_ids": [2]}},
        "tokens",
        "both allowed and banned: [2]",
    ),
    (
        "draft wildcard mixed",
        {"speculation": {"draft_versions": ["*", "2"]}},
        "speculation.draft_versions",
        "'*' must be the only entry",
    ),
    (
        "empty draft version",
        {"speculation": {"draft_versions": [""]}},
        "speculation.draft_versions[0]",
        "should be non-empty",
    ),
    ("document is a list", [1, 2], "(document)", "is an array, expected object"),
    ("document is empty", None, "(document)", "is empty"),
]


@pytest.mark.parametrize(
    ("doc", "path", "words"), [c[1:] for c in BAD_TENANT_DOCS], ids=[c[0] for c in BAD_TENANT_DOCS]
)
def test_bad_tenant_document_is_refused_with_file_and_path(doc: Any, path: str, words: str) -> None:
    with pytest.raises(PolicyError) as info:
        build_bundle(default_doc(), {"acme": doc})
    message = str(info.value)
    assert message.startswith(f"tenants/acme.yaml: {path}: "), message
    assert words in message
    assert info.value.problems[0].file == "tenants/acme.yaml"
    assert info.value.problems[0].path == path


def test_example_message_from_the_issue() -> None:
    with pytest.raises(PolicyError) as info:
        build_bundle(default_doc(), {"acme": {"speculation": {"k": {"max": 0}}}})
    assert (
        str(info.value) == "tenants/acme.yaml: speculation.k.max: 0 is less than the minimum of 1"
    )


def test_every_problem_is_reported_not_only_the_first() -> None:
    doc = {"mode": "fast", "retention": {"payload_days": -3}, "extra": 1}
    with pytest.raises(PolicyError) as info:
        build_bundle(default_doc(), {"acme": doc, "beta": {"load": {"enforcement": "x"}}})
    paths = {(p.file, p.path) for p in info.value.problems}
    assert paths == {
        ("tenants/acme.yaml", "mode"),
        ("tenants/acme.yaml", "retention.payload_days"),
        ("tenants/acme.yaml", "extra"),
        ("tenants/beta.yaml", "load.enforcement"),
    }


@pytest.mark.parametrize("key", ["mode", "speculation", "auto", "tokens", "rate_limits"])
def test_default_must_be_complete(key: str) -> None:
    doc = default_doc()
    del doc[key]
    with pytest.raises(PolicyError, match=rf"^default.yaml: {key}: required key is missing"):
        build_bundle(doc, {})


def test_default_nested_key_missing() -> None:
    doc = default_doc()
    del doc["auto"]["prior"]["prediction"]
    with pytest.raises(PolicyError, match=r"default.yaml: auto.prior.prediction: required key"):
        build_bundle(doc, {})


def test_default_semantic_error_names_default_file() -> None:
    doc = deep_merge(default_doc(), {"speculation": {"k": {"min": 4, "max": 2}}})
    with pytest.raises(PolicyError, match=r"^default.yaml: speculation.k: min 4 is greater"):
        build_bundle(doc, {})


@pytest.mark.parametrize("tenant", ["", "../etc", "a b", "x" * 65, "-lead"])
def test_bad_tenant_ids(tenant: str) -> None:
    with pytest.raises(PolicyError, match="invalid tenant id"):
        build_bundle(default_doc(), {tenant: {}})


def test_ewma_is_replaced_whole_by_a_tenant() -> None:
    bundle = build_bundle(default_doc(), {"acme": {"auto": {"ewma": {"alpha": 0.3}}}})
    assert bundle.policy_for("acme").auto.ewma_alpha == 0.3
    assert bundle.effective_document("acme")["auto"]["ewma"] == {"alpha": 0.3}


def test_schemas_are_valid_draft_2020_12() -> None:
    Draft202012Validator.check_schema(DEFAULT_SCHEMA)
    Draft202012Validator.check_schema(TENANT_SCHEMA)
    assert DEFAULT_SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def _copy_bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    shutil.copytree(BUNDLES, root)
    return root


def test_shipped_bundle_loads() -> None:
    bundle = load_bundle_dir(BUNDLES)
    assert {"acme", "labs"} <= set(bundle.tenants)
    assert bundle.policy_for("acme").payload_retention_days == 0


@pytest.mark.parametrize(
    ("file", "text", "expected"),
    [
        (
            "tenants/bad.yaml",
            "mode: auto\nmode: standard\n",
            "tenants/bad.yaml: line 2, column 1: invalid YAML: duplicate key 'mode'",
        ),
        ("tenants/bad.yaml", "speculation: {k: [1\n", "tenants/bad.yaml: line 2"),
        (
            "tenants/bad.yaml",
            "speculation:\n  k:\n    max: 0\n",
            "tenants/bad.yaml: speculation.k.max: 0 is less than the minimum of 1",
        ),
        ("tenants/notes.txt", "hello", "tenants/notes.txt: (file name): not a .yaml file"),
        ("tenants/acme.yml", "mode: auto\n", "tenants/acme.yml: (file name): tenant defined twice"),
        ("default.yaml", "", "default.yaml: (document): is empty"),
    ],
)
def test_load_dir_errors_name_the_file(tmp_path: Path, file: str, text: str, expected: str) -> None:
    root = _copy_bundle(tmp_path)
    (root / file).write_text(text)
    with pytest.raises(PolicyError) as info:
        load_bundle_dir(root)
    assert expected in str(info.value)


def test_load_dir_without_default(tmp_path: Path) -> None:
    root = _copy_bundle(tmp_path)
    (root / "default.yaml").unlink()
    with pytest.raises(PolicyError, match=r"^default.yaml: \(file\): cannot read"):
        load_bundle_dir(root)
