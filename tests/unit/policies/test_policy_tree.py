"""speculation.tree: a tenant's policy gives its draft-model (and head) requests a draft
tree shape; chains by default, for other proposers and when standard."""

from __future__ import annotations

import pytest
from policy_helpers import bundle_with, context, request

from policies import decide
from policies.bundle import PolicyError


def test_chains_by_default() -> None:
    d = decide(bundle_with({"mode": "speculative"}), context())
    assert d.mode == "speculative" and d.proposer == "draft"
    assert d.tree == ()


def test_a_tenant_policy_turns_trees_on_for_drafts() -> None:
    doc = {"mode": "speculative", "speculation": {"tree": [3, 2]}}
    d = decide(bundle_with(doc), context())
    assert d.proposer == "draft" and d.tree == (3, 2)


def test_no_tree_for_other_proposers_or_standard() -> None:
    doc = {"mode": "speculative", "speculation": {"tree": [3, 2], "proposers": ["prompt_lookup"]}}
    assert decide(bundle_with(doc), context()).tree == ()
    doc = {"mode": "standard", "speculation": {"tree": [3, 2]}}
    assert decide(bundle_with(doc), context(request(max_tokens=128))).tree == ()


@pytest.mark.parametrize("tree", [[0], [9], [2, 2, 2, 2, 2], ["3"]])
def test_a_bad_shape_is_refused(tree) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PolicyError):
        bundle_with({"speculation": {"tree": tree}})
