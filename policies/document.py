"""The effective policy of one tenant as typed, frozen values.

`parse_policy` turns a validated, merged document (default deep-merged with the tenant's
document) into a `TenantPolicy`; `semantic_problems` finds what a JSON Schema cannot say
(k.min <= k.max, a token both allowed and banned).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.costmodel import alpha_from_half_life

ENFORCE = "enforce"
DRYRUN = "dryrun"


@dataclass(frozen=True)
class ClientOverrideRule:
    allow: bool
    enforcement: str


@dataclass(frozen=True)
class SpeculationRule:
    proposers: tuple[str, ...]
    draft_versions: tuple[str, ...]
    """Allowed draft versions; ("*",) allows every version the registry offers."""
    k_min: int
    k_max: int
    min_max_tokens: int
    enforcement: str
    tree: tuple[int, ...] = ()
    """Draft trees of this shape for draft models and heads (children of the main chain's
    node per depth, the main child included); (): chains."""

    def allows_draft_version(self, version: str) -> bool:
        return "*" in self.draft_versions or version in self.draft_versions


@dataclass(frozen=True)
class DeterminismRule:
    seed_forces_standard: bool
    enforcement: str


@dataclass(frozen=True)
class LoadRule:
    shed_queue_depth: int
    enforcement: str


@dataclass(frozen=True)
class Prior:
    acceptance: float
    c: float


@dataclass(frozen=True)
class AutoParams:
    margin: float
    hysteresis: float
    probe_rate: float
    ewma_alpha: float
    """Weight of the newest request in the EWMA (from `alpha` or `half_life`)."""
    min_samples: int
    priors: Mapping[str, Prior]


@dataclass(frozen=True)
class RateLimits:
    requests_per_minute: int | None
    tokens_per_minute: int | None
    enforcement: str


@dataclass(frozen=True)
class Fairness:
    """The tenant's share of the inference worker (serving/fairness.py): admission into the
    batch and the queue goes to the backlogged tenant with the fewest weighted tokens
    served (a virtual token counter); the caps bound what one tenant holds at once.
    None: the gateway's default (see policies/README.md)."""

    weight: float
    """Relative share: a tenant of weight 2 is served twice the tokens of one of weight 1
    while both wait."""
    max_concurrent_requests: int | None
    max_rows: int | None
    """Rows of a target's batch the tenant's requests may hold at once."""
    max_queued: int | None
    """Jobs (one per choice) the tenant may have waiting for a row."""


@dataclass(frozen=True)
class ReasoningRule:
    max_tokens: int | None
    """Most thinking tokens a thinking model may write before its answer (None: no cap);
    past it the end of the thinking is forced (gateway/serving/reasoning.py)."""


@dataclass(frozen=True)
class TokenLists:
    allowed_token_ids: tuple[int, ...]
    """Empty: no allow-list."""
    banned_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class TenantPolicy:
    """Everything the bundle says about one tenant, after merging."""

    mode: str
    client_override: ClientOverrideRule
    speculation: SpeculationRule
    determinism: DeterminismRule
    load: LoadRule
    auto: AutoParams
    payload_retention_days: int
    """0: never store prompt or completion text."""
    rate_limits: RateLimits
    tokens: TokenLists
    fairness: Fairness
    reasoning: ReasoningRule


def parse_policy(doc: Mapping[str, Any]) -> TenantPolicy:
    """A merged document that passed DEFAULT_SCHEMA and `semantic_problems` -> TenantPolicy."""
    spec = doc["speculation"]
    auto = doc["auto"]
    ewma = auto["ewma"]
    alpha = float(ewma["alpha"]) if "alpha" in ewma else alpha_from_half_life(ewma["half_life"])
    return TenantPolicy(
        mode=doc["mode"],
        client_override=ClientOverrideRule(
            allow=doc["client_override"]["allow"],
            enforcement=doc["client_override"]["enforcement"],
        ),
        speculation=SpeculationRule(
            proposers=tuple(spec["proposers"]),
            draft_versions=tuple(spec["draft_versions"]),
            k_min=spec["k"]["min"],
            k_max=spec["k"]["max"],
            min_max_tokens=spec["min_max_tokens"],
            enforcement=spec["enforcement"],
            tree=tuple(spec.get("tree", ())),
        ),
        determinism=DeterminismRule(
            seed_forces_standard=doc["determinism"]["seed_forces_standard"],
            enforcement=doc["determinism"]["enforcement"],
        ),
        load=LoadRule(
            shed_queue_depth=doc["load"]["shed_queue_depth"],
            enforcement=doc["load"]["enforcement"],
        ),
        auto=AutoParams(
            margin=float(auto["margin"]),
            hysteresis=float(auto["hysteresis"]),
            probe_rate=float(auto["probe_rate"]),
            ewma_alpha=alpha,
            min_samples=auto["min_samples"],
            priors={
                name: Prior(acceptance=float(p["acceptance"]), c=float(p["c"]))
                for name, p in auto["prior"].items()
            },
        ),
        payload_retention_days=doc["retention"]["payload_days"],
        rate_limits=RateLimits(
            requests_per_minute=doc["rate_limits"]["requests_per_minute"],
            tokens_per_minute=doc["rate_limits"]["tokens_per_minute"],
            enforcement=doc["rate_limits"]["enforcement"],
        ),
        tokens=TokenLists(
            allowed_token_ids=tuple(doc["tokens"]["allowed_token_ids"]),
            banned_token_ids=tuple(doc["tokens"]["banned_token_ids"]),
        ),
        fairness=Fairness(
            weight=float(doc["fairness"]["weight"]),
            max_concurrent_requests=doc["fairness"]["max_concurrent_requests"],
            max_rows=doc["fairness"]["max_rows"],
            max_queued=doc["fairness"]["max_queued"],
        ),
        reasoning=ReasoningRule(max_tokens=doc["reasoning"]["max_tokens"]),
    )


def semantic_problems(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Cross-field checks on a merged document that passed DEFAULT_SCHEMA."""
    problems: list[tuple[str, str]] = []
    k = doc["speculation"]["k"]
    if k["min"] > k["max"]:
        problems.append(("speculation.k", f"min {k['min']} is greater than max {k['max']}"))
    if (
        "*" in doc["speculation"]["draft_versions"]
        and len(doc["speculation"]["draft_versions"]) > 1
    ):
        problems.append(("speculation.draft_versions", "'*' must be the only entry"))
    tokens = doc["tokens"]
    both = sorted(set(tokens["allowed_token_ids"]) & set(tokens["banned_token_ids"]))
    if both:
        problems.append(("tokens", f"token ids both allowed and banned: {both}"))
    return problems
