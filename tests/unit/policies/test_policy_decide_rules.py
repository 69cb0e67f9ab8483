"""Decision table, part 1: mode, client override, seed and load gates, min max_tokens."""

from __future__ import annotations

import pytest
from decision_rows import LOW, Row, check_row

from policies import Load

ROWS = [
    Row(
        "default auto, prior says speculate",
        "speculative",
        "draft",
        "2",
        ("mode_auto", "cold_start_prior", "auto_speculative"),
        ("mode", "auto.prior", "auto"),
        expect={"resolved_mode": "speculative", "auto_outcome": "speculative"},
    ),
    Row(
        "tenant mode standard",
        "standard",
        tenant={"mode": "standard"},
        reasons=("mode_standard",),
        rules=("mode",),
        expect={"resolved_mode": "standard", "auto_outcome": None, "k": None},
    ),
    Row(
        "tenant mode speculative ignores low history",
        "speculative",
        "draft",
        "2",
        ("mode_speculative",),
        tenant={"mode": "speculative"},
        ctx={"history": LOW},
        expect={"auto_outcome": None},
    ),
    Row(
        "client asks standard, override allowed",
        "standard",
        reasons=("override_honoured", "mode_standard"),
        rules=("client_override",),
        req={"requested_mode": "standard"},
    ),
    Row(
        "client asks speculative on a standard tenant",
        "speculative",
        "draft",
        "2",
        ("override_honoured", "mode_speculative"),
        ("client_override",),
        tenant={"mode": "standard"},
        req={"requested_mode": "speculative"},
    ),
    Row(
        "override denied (enforce)",
        "standard",
        reasons=("override_denied", "mode_standard"),
        rules=("client_override", "mode"),
        tenant={"mode": "standard", "client_override": {"allow": False}},
        req={"requested_mode": "speculative"},
    ),
    Row(
        "override denied in dry-run is honoured and recorded",
        "speculative",
        "draft",
        "2",
        ("override_honoured",),
        dryrun=("dryrun:override_denied",),
        tenant={"mode": "standard", "client_override": {"allow": False, "enforcement": "dryrun"}},
        req={"requested_mode": "speculative"},
    ),
    Row(
        "unknown requested mode falls back to policy",
        "speculative",
        "draft",
        "2",
        ("override_honoured", "unknown_requested_mode", "mode_auto"),
        req={"requested_mode": "turbo"},
    ),
    Row(
        "seed forces standard (enforce)",
        "standard",
        "draft",
        reasons=("auto_speculative", "seed_forces_standard"),
        rules=("determinism",),
        req={"seed": 7},
        expect={"resolved_mode": "speculative", "proposer": None},
    ),
    Row(
        "seed rule in dry-run only records",
        "speculative",
        "draft",
        "2",
        ("auto_speculative",),
        dryrun=("dryrun:seed_forces_standard",),
        tenant={"determinism": {"enforcement": "dryrun"}},
        req={"seed": 7},
    ),
    Row(
        "seed rule switched off",
        "speculative",
        "draft",
        "2",
        tenant={"determinism": {"seed_forces_standard": False}},
        req={"seed": 7},
    ),
    Row(
        "seed rule dry-run records nothing when already standard",
        "standard",
        tenant={"determinism": {"enforcement": "dryrun"}},
        req={"seed": 7},
        ctx={"history": LOW},
        reasons=("auto_standard",),
    ),
    Row(
        "load shed at the threshold",
        "standard",
        reasons=("load_shed",),
        rules=("load",),
        ctx={"load": Load(queue_depth=64, capacity=64)},
    ),
    Row(
        "just below the load threshold",
        "speculative",
        "draft",
        "2",
        ctx={"load": Load(queue_depth=63, capacity=64)},
    ),
    Row(
        "load shed in dry-run",
        "speculative",
        "draft",
        "2",
        dryrun=("dryrun:load_shed",),
        tenant={"load": {"enforcement": "dryrun"}},
        ctx={"load": Load(100, 64)},
    ),
    Row(
        "probe is still load-shed",
        "standard",
        reasons=("probe", "load_shed"),
        ctx={"history": LOW, "probe_draw": 0.0, "load": Load(100, 64)},
    ),
    Row(
        "max_tokens below the minimum",
        "standard",
        reasons=("max_tokens_below_minimum",),
        rules=("speculation.min_max_tokens",),
        req={"max_tokens": 8},
    ),
    Row(
        "max_tokens minimum in dry-run",
        "speculative",
        "draft",
        "2",
        dryrun=("dryrun:max_tokens_below_minimum",),
        tenant={"speculation": {"enforcement": "dryrun"}},
        req={"max_tokens": 8},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_decision_table_rules(row: Row) -> None:
    check_row(row)
