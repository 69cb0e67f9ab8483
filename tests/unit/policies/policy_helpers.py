"""Builders for policy tests: the shipped default document, bundles, requests, contexts."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from policies import (
    Capabilities,
    DecisionContext,
    HistoryEntry,
    Load,
    PolicyBundle,
    RequestFeatures,
    build_bundle,
)
from policies.bundle import deep_merge

REPO = Path(__file__).resolve().parents[3]
BUNDLES = REPO / "policies" / "bundles"
README = REPO / "policies" / "README.md"


def default_doc() -> dict[str, Any]:
    doc = yaml.safe_load((BUNDLES / "default.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def bundle_with(
    tenant_doc: dict[str, Any] | None = None,
    default_patch: dict[str, Any] | None = None,
    tenant: str = "t",
) -> PolicyBundle:
    default = deep_merge(default_doc(), default_patch or {})
    return build_bundle(default, {tenant: tenant_doc} if tenant_doc is not None else {})


def request(**changes: Any) -> RequestFeatures:
    base = RequestFeatures(
        endpoint="/v1/chat/completions",
        model="target",
        requested_mode=None,
        requested_proposer=None,
        requested_k=None,
        max_tokens=128,
        temperature=0.7,
        top_p=1.0,
        seed=None,
        has_prediction=False,
        constraint="none",
        prompt_tokens=50,
    )
    return dataclasses.replace(base, **changes)


def history(proposer: str, version: str | None, a: float, c: float, n: int) -> dict[Any, Any]:
    return {(proposer, version): HistoryEntry(acceptance=a, c=c, samples=n)}


def context(req: RequestFeatures | None = None, **changes: Any) -> DecisionContext:
    base = DecisionContext(
        tenant_id="t",
        request=req if req is not None else request(),
        history={},
        global_history={},
        load=Load(queue_depth=0, capacity=16),
        capabilities=Capabilities(draft_versions=("1", "2"), preferred_draft_version="2"),
        previous_mode=None,
        probe_draw=0.99,
        decision_id="d-1",
    )
    return dataclasses.replace(base, **changes)
