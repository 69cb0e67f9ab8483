"""Values that cross the seam between the gateway and the policy decision point.

Everything here is a frozen dataclass of plain Python values, so a `Decision` can be logged,
audited and serialised without knowing anything about the engine or the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

Mode = Literal["auto", "speculative", "standard"]
EffectiveMode = Literal["speculative", "standard"]
Proposer = Literal["draft", "prompt_lookup", "prediction", "suffix"]
Constraint = Literal["none", "json_object", "json_schema", "logit_bias"]

MODES: Final = ("auto", "speculative", "standard")
PROPOSERS: Final = ("draft", "prompt_lookup", "prediction", "suffix")
CONSTRAINTS: Final = ("none", "json_object", "json_schema", "logit_bias")

HistoryKey = tuple[str, str | None]
"""(proposer, draft_version) ; draft_version is None for every proposer but "draft"."""


@dataclass(frozen=True)
class RequestFeatures:
    """What the policy may know about one request (never its text)."""

    endpoint: str
    model: str
    requested_mode: str | None
    """The request's `decoding.mode`: "auto" | "speculative" | "standard", or None."""
    requested_proposer: str | None
    requested_k: int | None
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    has_prediction: bool
    """True when the request carries OpenAI `prediction` text."""
    constraint: str
    """"none" | "json_object" | "json_schema" | "logit_bias"."""
    prompt_tokens: int


@dataclass(frozen=True)
class HistoryEntry:
    """Exponentially weighted acceptance history for one (proposer, draft version)."""

    acceptance: float
    """EWMA of each request's per-token acceptance, accepted / (accepted + verify steps that
    rejected a drafted token), in [0, 1]: the a of E(a, k) (policies/costmodel.py)."""
    c: float
    """EWMA of the cost ratio: one proposer step / one target step."""
    samples: int
    """Requests folded in so far."""


@dataclass(frozen=True)
class Load:
    queue_depth: int
    """Requests waiting for the inference worker right now."""
    capacity: int
    """Requests the worker can hold; reported in `Decision.inputs` only."""
    batch_rows: int = 1
    """Rows the request is expected to share each forward with (itself included): the batch
    size the cost model assumes, recorded in `Decision.inputs`."""
    verify_cost: tuple[float, ...] = ()
    """Measured at `batch_rows`: verify_cost[k] = a verify forward of k + 1 tokens per row
    in standard steps (empty: not measured, the paper's 1)."""
    draft_c: Mapping[str, float] = field(default_factory=dict)
    """Measured at `batch_rows`, per loaded draft version: one draft forward / one standard
    step. Used for c instead of the history's when present."""


@dataclass(frozen=True)
class Capabilities:
    draft_versions: tuple[str, ...]
    """Draft versions loaded and compatible with the target, in the registry's order."""
    preferred_draft_version: str | None = None
    """The rollout's pick for this request (canary split done by the caller)."""


@dataclass(frozen=True)
class DecisionContext:
    """One frozen object with everything `decide` reads besides the policy bundle."""

    tenant_id: str
    request: RequestFeatures
    history: Mapping[HistoryKey, HistoryEntry]
    """This tenant's history per (proposer, draft_version)."""
    global_history: Mapping[HistoryKey, HistoryEntry]
    """All tenants together; used while the tenant has fewer than `auto.min_samples`."""
    load: Load
    capabilities: Capabilities
    previous_mode: str | None
    """The tenant's last `Decision.auto_outcome` (for hysteresis), None if never resolved."""
    probe_draw: float
    """Uniform draw in [0, 1) from the caller, so that `decide` stays pure."""
    decision_id: str


@dataclass(frozen=True)
class Decision:
    """The engine's answer for one request, with what it read and why it decided."""

    decision_id: str
    policy_revision: str
    policy_version: int
    tenant_id: str
    requested_mode: str | None
    """What the client asked for (None when the request had no `decoding.mode`)."""
    resolved_mode: str
    """The mode after override and auto resolution, before gates and fallbacks; never "auto"
    (auto stopped before the cost model, e.g. no proposer, resolves to "standard")."""
    mode: str
    """Effective: "speculative" | "standard"."""
    proposer: str | None
    draft_version: str | None
    k_min: int
    k_max: int
    k: int | None
    """Suggested draft length inside [k_min, k_max] (the cost model's best k)."""
    auto_outcome: str | None
    """What the auto cost model chose (hysteresis applied, probes not); None when the
    mode was not auto. Persist it and pass it back as `DecisionContext.previous_mode`."""
    reason_codes: tuple[str, ...]
    rule_ids: tuple[str, ...]
    inputs: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    dryrun: tuple[str, ...] = ()
    """Reason codes of dry-run rules that would have changed the outcome."""
    tree: tuple[int, ...] = ()
    """The draft tree shape the policy gives a speculative draft (model or head); (): chains."""

    @property
    def acceptance(self) -> float | None:
        """The acceptance rate the cost model used (history or prior, from `inputs`); None
        when the request decodes standard. The engine's k policy starts from it and `c`."""
        return self._speculative_input("acceptance")

    @property
    def c(self) -> float | None:
        """The cost ratio (proposer step / target step) the cost model used."""
        return self._speculative_input("c")

    def _speculative_input(self, name: str) -> float | None:
        value = self.inputs.get(name)
        if self.mode != "speculative" or not isinstance(value, int | float):
            return None
        return float(value)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (lists for tuples, plain dict for inputs)."""
        return {
            "decision_id": self.decision_id,
            "policy_revision": self.policy_revision,
            "policy_version": self.policy_version,
            "tenant_id": self.tenant_id,
            "requested_mode": self.requested_mode,
            "resolved_mode": self.resolved_mode,
            "mode": self.mode,
            "proposer": self.proposer,
            "draft_version": self.draft_version,
            "k_min": self.k_min,
            "k_max": self.k_max,
            "k": self.k,
            "auto_outcome": self.auto_outcome,
            "reason_codes": list(self.reason_codes),
            "rule_ids": list(self.rule_ids),
            "inputs": dict(self.inputs),
            "dryrun": list(self.dryrun),
        }


class Reason:
    """Stable reason codes (snake_case). Dry-run variants are "dryrun:" + code."""

    MODE_AUTO: Final = "mode_auto"
    MODE_SPECULATIVE: Final = "mode_speculative"
    MODE_STANDARD: Final = "mode_standard"
    OVERRIDE_HONOURED: Final = "override_honoured"
    OVERRIDE_DENIED: Final = "override_denied"
    UNKNOWN_REQUESTED_MODE: Final = "unknown_requested_mode"
    PROPOSER_NOT_ALLOWED: Final = "proposer_not_allowed"
    DRAFT_VERSION_NOT_ALLOWED: Final = "draft_version_not_allowed"
    PREDICTION_MISSING: Final = "prediction_missing"
    DRAFT_UNAVAILABLE: Final = "draft_unavailable"
    NO_PROPOSER_AVAILABLE: Final = "no_proposer_available"
    MAX_TOKENS_BELOW_MINIMUM: Final = "max_tokens_below_minimum"
    K_CLAMPED: Final = "k_clamped"
    SEED_FORCES_STANDARD: Final = "seed_forces_standard"
    LOAD_SHED: Final = "load_shed"
    COLD_START_GLOBAL: Final = "cold_start_global"
    COLD_START_PRIOR: Final = "cold_start_prior"
    AUTO_SPECULATIVE: Final = "auto_speculative"
    AUTO_STANDARD: Final = "auto_standard"
    HYSTERESIS_HOLD: Final = "hysteresis_hold"
    PROBE: Final = "probe"


def dryrun(code: str) -> str:
    """The reason code a dry-run rule records instead of acting."""
    return f"dryrun:{code}"
