"""Policy decision point: per-tenant decoding mode (speculative or standard) from YAML policy
bundles, acceptance history and load. A leaf: pure Python + YAML + jsonschema.

    store = PolicyStore.from_dir("policies/bundles")
    decision = decide(store.active, ctx)        # ctx: DecisionContext
    entry = update_history(entry, drafted, accepted, c, policy.auto.ewma_alpha)
"""

from policies.bundle import PolicyBundle, PolicyError, Problem, build_bundle, load_bundle_dir
from policies.costmodel import best_k, expected_speedup, expected_tokens, update_history
from policies.decide import decide
from policies.document import TenantPolicy
from policies.store import Activation, PolicyStore
from policies.types import (
    Capabilities,
    Decision,
    DecisionContext,
    HistoryEntry,
    Load,
    Reason,
    RequestFeatures,
)

__all__ = [
    "Activation",
    "Capabilities",
    "Decision",
    "DecisionContext",
    "HistoryEntry",
    "Load",
    "PolicyBundle",
    "PolicyError",
    "PolicyStore",
    "Problem",
    "Reason",
    "RequestFeatures",
    "TenantPolicy",
    "best_k",
    "build_bundle",
    "decide",
    "expected_speedup",
    "expected_tokens",
    "load_bundle_dir",
    "update_history",
]
