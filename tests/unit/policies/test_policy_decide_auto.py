"""Decision table, part 2: proposers and compatibility, auto mode, cold start, k; plus the
k-maximisation property and decisions under the shipped bundle."""

from __future__ import annotations

import pytest
from decision_rows import BAND_HIGH, BAND_LOW, HIGH, LOW, NO_DRAFTS, Row, check_row
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import BUNDLES, bundle_with, context, history, request

from policies import PolicyStore, decide, expected_speedup

ROWS = [
    Row(
        "prediction text present -> prediction proposer",
        "speculative",
        "prediction",
        req={"has_prediction": True},
    ),
    Row(
        "prediction requested without text -> standard",
        "standard",
        reasons=("prediction_missing",),
        rules=("builtin.compatibility",),
        req={"requested_proposer": "prediction"},
    ),
    Row(
        "draft requested, none available -> standard",
        "standard",
        reasons=("draft_unavailable",),
        req={"requested_proposer": "draft"},
        ctx={"capabilities": NO_DRAFTS},
    ),
    Row(
        "no draft available -> prompt lookup",
        "speculative",
        "prompt_lookup",
        ctx={"capabilities": NO_DRAFTS},
    ),
    Row(
        "only draft allowed and none available",
        "standard",
        reasons=("no_proposer_available",),
        tenant={"speculation": {"proposers": ["draft"]}},
        ctx={"capabilities": NO_DRAFTS},
    ),
    Row(
        "requested proposer not allowed -> automatic pick",
        "speculative",
        "draft",
        "2",
        ("proposer_not_allowed",),
        ("speculation.proposers",),
        tenant={"speculation": {"proposers": ["draft"]}},
        req={"requested_proposer": "prompt_lookup"},
    ),
    Row(
        "requested prompt lookup honoured",
        "speculative",
        "prompt_lookup",
        req={"requested_proposer": "prompt_lookup"},
    ),
    Row(
        "proposer allow-list in dry-run",
        "speculative",
        "prediction",
        dryrun=("dryrun:proposer_not_allowed",),
        tenant={"speculation": {"proposers": ["draft"], "enforcement": "dryrun"}},
        req={"has_prediction": True},
    ),
    Row(
        "preferred draft version not allowed -> allowed one",
        "speculative",
        "draft",
        "1",
        ("draft_version_not_allowed",),
        ("speculation.draft_versions",),
        tenant={"speculation": {"draft_versions": ["1"]}},
    ),
    Row(
        "no allowed draft version -> prompt lookup",
        "speculative",
        "prompt_lookup",
        reasons=("draft_version_not_allowed",),
        tenant={"speculation": {"draft_versions": ["9"]}},
    ),
    Row(
        "draft version allow-list in dry-run",
        "speculative",
        "draft",
        "2",
        dryrun=("dryrun:draft_version_not_allowed",),
        tenant={"speculation": {"draft_versions": ["9"], "enforcement": "dryrun"}},
    ),
    Row(
        "auto, high tenant acceptance",
        "speculative",
        "draft",
        "2",
        ("auto_speculative",),
        ctx={"history": HIGH},
        expect={"inputs.history_source": "tenant"},
    ),
    Row(
        "auto, low tenant acceptance",
        "standard",
        reasons=("auto_standard",),
        rules=("auto",),
        ctx={"history": LOW},
        expect={"resolved_mode": "standard", "auto_outcome": "standard", "proposer": None},
    ),
    Row(
        "auto, low acceptance, probe",
        "speculative",
        "draft",
        "2",
        ("auto_standard", "probe"),
        ("auto.probe_rate",),
        ctx={"history": LOW, "probe_draw": 0.01},
        expect={"resolved_mode": "standard", "auto_outcome": "standard"},
    ),
    Row(
        "probe draw equal to the rate does not probe",
        "standard",
        ctx={"history": LOW, "probe_draw": 0.05},
    ),
    Row(
        "cold start: few tenant samples, global history high",
        "speculative",
        "draft",
        "2",
        ("cold_start_global",),
        ("auto.min_samples",),
        ctx={"history": history("draft", "2", 0.05, 0.1, 5), "global_history": HIGH},
        expect={"inputs.history_source": "global", "inputs.tenant_samples": 5},
    ),
    Row(
        "cold start: few tenant samples, global history low",
        "standard",
        reasons=("cold_start_global", "auto_standard"),
        ctx={"history": history("draft", "2", 0.9, 0.1, 5), "global_history": LOW},
    ),
    Row(
        "cold start: global history is for another draft version -> prior",
        "speculative",
        "draft",
        "2",
        ("cold_start_prior",),
        ctx={"global_history": history("draft", "1", 0, 0, 99)},
    ),
    Row(
        "cold start: low prior",
        "standard",
        reasons=("cold_start_prior", "auto_standard"),
        tenant={"auto": {"prior": {"draft": {"acceptance": 0.05}}}},
    ),
    Row(
        "requested k honoured",
        "speculative",
        "draft",
        "2",
        req={"requested_k": 3},
        expect={"k_min": 3, "k_max": 3, "k": 3},
    ),
    Row(
        "requested k clamped",
        "speculative",
        "draft",
        "2",
        ("k_clamped",),
        ("speculation.k",),
        req={"requested_k": 20},
        expect={"k_min": 8, "k_max": 8, "k": 8},
    ),
    Row(
        "requested k ignored when override denied",
        "speculative",
        "draft",
        "2",
        ("override_denied",),
        tenant={"client_override": {"allow": False}},
        req={"requested_k": 3},
        expect={"k_min": 1, "k_max": 8},
    ),
    Row(
        "hysteresis holds speculative in the lower band",
        "speculative",
        "draft",
        "2",
        ("hysteresis_hold", "auto_speculative"),
        ("auto.hysteresis",),
        ctx={"history": BAND_LOW, "previous_mode": "speculative"},
    ),
    Row(
        "lower band without previous outcome -> standard",
        "standard",
        reasons=("auto_standard",),
        ctx={"history": BAND_LOW},
    ),
    Row(
        "hysteresis holds standard in the upper band",
        "standard",
        reasons=("hysteresis_hold", "auto_standard"),
        ctx={"history": BAND_HIGH, "previous_mode": "standard"},
    ),
    Row(
        "upper band without previous outcome -> speculative",
        "speculative",
        "draft",
        "2",
        ("auto_speculative",),
        ctx={"history": BAND_HIGH},
    ),
    Row(
        "unknown tenant gets the default",
        "standard",
        tenant={"mode": "speculative"},
        ctx={"tenant_id": "other", "history": LOW},
        reasons=("auto_standard",),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_decision_table_auto(row: Row) -> None:
    check_row(row)


def test_decision_carries_bundle_revision_version_and_ids() -> None:
    store = PolicyStore.from_dir(BUNDLES)
    decision = decide(store.active, context(decision_id="abc123", tenant_id="acme"))
    assert decision.policy_revision == store.active.revision
    assert decision.policy_version == 1
    assert decision.decision_id == "abc123"
    assert decision.tenant_id == "acme"
    assert decision.draft_version == "2"  # acme allows only v2; k capped at 4 by acme.yaml
    assert decision.k_max == 4


def test_shipped_labs_tenant_records_seed_rule_in_dryrun() -> None:
    store = PolicyStore.from_dir(BUNDLES)
    decision = decide(store.active, context(request(seed=1), tenant_id="labs"))
    assert decision.mode == "speculative"
    assert decision.dryrun == ("dryrun:seed_forces_standard",)


def test_decide_is_pure() -> None:
    bundle = bundle_with()
    ctx = context(history=BAND_LOW, previous_mode="speculative")
    assert decide(bundle, ctx) == decide(bundle, ctx)


@settings(max_examples=200, deadline=None)
@given(
    a=st.floats(0.0, 1.0),
    c=st.floats(0.0, 1.0),
    k_min=st.integers(1, 6),
    width=st.integers(0, 8),
)
def test_chosen_k_maximises_the_speedup_formula(a: float, c: float, k_min: int, width: int) -> None:
    k_max = k_min + width
    bundle = bundle_with(
        {"mode": "speculative", "speculation": {"k": {"min": k_min, "max": k_max}}}
    )
    decision = decide(bundle, context(history=history("draft", "2", a, c, 1000)))
    assert decision.k is not None
    chosen = expected_speedup(a, decision.k, c)
    assert all(chosen >= expected_speedup(a, k, c) for k in range(k_min, k_max + 1))
    assert decision.inputs["expected_speedup"] == pytest.approx(chosen)


def test_known_best_k() -> None:
    # a = 0.8, c = 0.1: S(k) = 1.636, 2.033, 2.271, 2.401, 2.460, 2.470, 2.448, 2.405 (k=1..8)
    bundle = bundle_with({"mode": "speculative"})
    decision = decide(bundle, context(history=history("draft", "2", 0.8, 0.1, 1000)))
    assert decision.k == 6
    assert decision.inputs["expected_speedup"] == pytest.approx(2.4696, abs=1e-4)
