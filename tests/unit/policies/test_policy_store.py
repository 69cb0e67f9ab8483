"""PolicyStore: refusals keep the active bundle; revision tracks content; versions only grow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import BUNDLES, default_doc

from policies import PolicyError, PolicyStore, build_bundle


def _store() -> PolicyStore:
    return PolicyStore.from_dir(BUNDLES)


def test_first_activation() -> None:
    store = PolicyStore()
    with pytest.raises(PolicyError, match="no policy bundle is active"):
        _ = store.active
    activation = store.load_dir(BUNDLES)
    assert activation.version == 1 == store.active.version == store.version
    assert activation.before is None
    assert activation.after == activation.revision == store.active.revision
    assert activation.changed
    assert activation.source == f"load_dir:{BUNDLES}"
    assert len(activation.revision) == 12
    json.dumps(activation.to_dict())


def test_put_tenant_changes_revision_and_bumps_version() -> None:
    store = _store()
    before = store.active
    activation = store.put_tenant("newco", {"mode": "standard"})
    assert activation.changed and activation.version == 2
    assert activation.before == before.revision != activation.after
    assert store.active.policy_for("newco").mode == "standard"
    assert before.policy_for("newco").mode == "auto"  # the old bundle object is untouched
    assert activation.source == "put_tenant:newco"


def test_same_content_same_revision_no_new_version() -> None:
    store = _store()
    rev = store.active.revision
    again = store.load_dir(BUNDLES)
    assert not again.changed
    assert again.version == 1 and again.revision == rev == again.before
    same_doc = store.active.to_dict()["tenants"]["acme"]
    assert not store.put_tenant("acme", same_doc).changed
    assert store.version == 1


def test_revision_ignores_key_order_and_formatting(tmp_path: Path) -> None:
    root = tmp_path / "b"
    shutil.copytree(BUNDLES, root)
    acme = root / "tenants" / "acme.yaml"
    acme.write_text(
        "retention: {payload_days: 0}\n"
        "rate_limits: {requests_per_minute: 120}\n"
        "speculation:\n  k: {max: 4}\n  draft_versions: ['2']\n"
        "client_override: {allow: false}\n"
        "description: Acme Bank; compliance-reviewed settings.\n"
    )
    assert PolicyStore.from_dir(root).active.revision == _store().active.revision


@pytest.mark.parametrize(
    "bad",
    [
        {"speculation": {"k": {"max": 0}}},
        {"mode": "fast"},
        {"speculation": {"k": {"min": 6, "max": 2}}},
        {"nonsense": True},
        {"retention": {"payload_days": -1}},
    ],
)
def test_refused_put_keeps_active_bundle_revision_and_version(bad: dict[str, Any]) -> None:
    store = _store()
    active, version = store.active, store.version
    with pytest.raises(PolicyError, match=r"^tenants/acme.yaml: "):
        store.put_tenant("acme", bad)
    assert store.active is active
    assert store.active.revision == active.revision
    assert store.version == version
    assert store.active.policy_for("acme").speculation.k_max == 4


def test_refused_load_dir_keeps_active_bundle(tmp_path: Path) -> None:
    store = _store()
    active = store.active
    root = tmp_path / "b"
    shutil.copytree(BUNDLES, root)
    (root / "tenants" / "acme.yaml").write_text("speculation:\n  k:\n    max: 0\n")
    with pytest.raises(PolicyError, match=r"tenants/acme\.yaml: speculation\.k\.max"):
        store.load_dir(root)
    assert store.active is active and store.version == 1


def test_remove_tenant_falls_back_to_default() -> None:
    store = _store()
    activation = store.remove_tenant("acme")
    assert activation.changed and activation.version == 2
    assert store.active.policy_for("acme").payload_retention_days == 30
    assert not store.remove_tenant("acme").changed


def test_load_dir_replaces_tenants(tmp_path: Path) -> None:
    store = _store()
    store.put_tenant("temp", {"mode": "standard"})
    store.load_dir(BUNDLES)
    assert "temp" not in store.active.tenants
    assert store.version == 3


def test_bundle_documents_are_read_only() -> None:
    bundle = _store().active
    with pytest.raises(TypeError):
        bundle.default["mode"] = "standard"  # type: ignore[index]
    with pytest.raises(TypeError):
        bundle.tenants["acme"]["speculation"]["k"]["max"] = 9  # type: ignore[index]


def test_bundle_to_dict_is_json_and_rebuilds_the_same_revision() -> None:
    bundle = _store().active
    data = json.loads(json.dumps(bundle.to_dict()))
    assert build_bundle(data["default"], data["tenants"]).revision == bundle.revision


DOCS = st.sampled_from(
    [
        {"mode": "standard"},
        {"mode": "speculative"},
        {"speculation": {"k": {"max": 3}}},
        {"auto": {"margin": 0.2}},
        {"mode": "fast"},  # invalid
        {"speculation": {"k": {"min": 9}}},  # invalid against the default's max
    ]
)
OPS = st.lists(
    st.tuples(st.sampled_from(["put", "remove"]), st.sampled_from(["a", "b"]), DOCS),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_version_monotonic_and_revision_iff_content(ops: list[tuple[str, str, Any]]) -> None:
    store = PolicyStore()
    assert store.activate(build_bundle(default_doc(), {}), "test").version == 1
    seen: dict[str, str] = {store.active.revision: json.dumps({})}
    for op, tenant, doc in ops:
        before_version, before_rev = store.version, store.active.revision
        try:
            act = store.put_tenant(tenant, doc) if op == "put" else store.remove_tenant(tenant)
        except PolicyError:
            assert (store.version, store.active.revision) == (before_version, before_rev)
            continue
        content = json.dumps(store.active.to_dict()["tenants"], sort_keys=True)
        assert seen.setdefault(act.after, content) == content  # same revision => same content
        assert act.changed == (act.after != before_rev)
        assert store.version == before_version + (1 if act.changed else 0)
    revisions_by_content: dict[str, set[str]] = {}
    for rev, content in seen.items():
        revisions_by_content.setdefault(content, set()).add(rev)
    assert all(len(r) == 1 for r in revisions_by_content.values())  # same content => same rev
