from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models_registry.errors import InvalidConfig, InvalidTransition
from models_registry.guard import Guard, GuardVerdict
from models_registry.regression import GateVerdict
from models_registry.rollout import (
    TRANSITIONS,
    PromotionBlocked,
    ProposedRollout,
    Rollout,
    RolloutState,
    apply_guard,
    pause,
    promote,
    resume,
    rollback,
    set_canary_percent,
    start_rollout,
    transition,
)

S = RolloutState
LEGAL = {
    (S.CANARY, S.PAUSED),
    (S.CANARY, S.PROMOTED),
    (S.CANARY, S.ROLLED_BACK),
    (S.PAUSED, S.CANARY),
    (S.PAUSED, S.PROMOTED),
    (S.PAUSED, S.ROLLED_BACK),
}


def rollout(state: RolloutState = S.CANARY, **kw: object) -> Rollout:
    proposed = ProposedRollout(
        target="demo-code-target",
        draft="demo-code-draft",
        version="2",
        baseline_version="1",
        canary_percent=10.0,
    )
    base = start_rollout("r1", proposed)
    return Rollout(**{**base.__dict__, "state": state, **kw})


def test_start_is_canary() -> None:
    proposed = ProposedRollout(
        target="t", draft="d", version="2", baseline_version="1", canary_percent=5, sticky=True
    )
    r = start_rollout("r1", proposed)
    assert (r.state, r.reason, r.sticky, r.guard) == (S.CANARY, "started", True, Guard())


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(S, S)))
def test_every_transition_pair(src: RolloutState, dst: RolloutState) -> None:
    r = rollout(src)
    if (src, dst) in LEGAL:
        moved = transition(r, dst, "because")
        assert (moved.state, moved.reason) == (dst, "because")
        assert r.state is src  # the original is untouched
    else:
        with pytest.raises(InvalidTransition) as err:
            transition(r, dst.value, "because")
        assert f"cannot go from {src.value} to {dst.value}" in str(err.value)
        assert "r1" in str(err.value)


def test_transition_table_matches_spec() -> None:
    assert {(a, b) for a, bs in TRANSITIONS.items() for b in bs} == LEGAL
    assert rollout(S.PROMOTED).terminal and rollout(S.ROLLED_BACK).terminal
    assert not rollout(S.CANARY).terminal and not rollout(S.PAUSED).terminal


def test_terminal_message_and_unknown_state() -> None:
    with pytest.raises(InvalidTransition, match="none, it is terminal"):
        pause(rollout(S.ROLLED_BACK))
    with pytest.raises(InvalidTransition, match="unknown rollout state 'full'"):
        transition(rollout(), "full", "x")


def test_helpers_walk_the_machine() -> None:
    r = resume(pause(rollout()))
    assert r.state is S.CANARY and r.reason == "resumed"
    assert rollback(r, "bad acceptance").reason == "bad acceptance"
    assert promote(pause(r)).state is S.PROMOTED


def test_promotion_blocked_by_failing_gate() -> None:
    failing = GateVerdict(False, "prompt 'fib': differs at token 3", 12)
    with pytest.raises(PromotionBlocked, match="prompt 'fib': differs at token 3"):
        promote(rollout(), failing)
    passed = promote(rollout(), GateVerdict(True, "12 prompts identical", 12))
    assert passed.state is S.PROMOTED and "12 prompts identical" in passed.reason


def test_canary_percent_ramp_only_while_active() -> None:
    assert set_canary_percent(rollout(), 50).canary_percent == 50
    assert set_canary_percent(rollout(S.PAUSED), 0).canary_percent == 0
    with pytest.raises(InvalidTransition):
        set_canary_percent(rollout(S.PROMOTED), 50)
    with pytest.raises(InvalidConfig, match="canary_percent"):
        set_canary_percent(rollout(), 150)


def test_apply_guard_rolls_back_only_a_canary() -> None:
    bad = GuardVerdict("rollback", "acceptance dropped")
    assert apply_guard(rollout(), bad).state is S.ROLLED_BACK
    assert apply_guard(rollout(), bad).reason == "guard: acceptance dropped"
    assert apply_guard(rollout(S.PAUSED), bad).state is S.PAUSED
    assert apply_guard(rollout(), GuardVerdict("continue", "ok")).state is S.CANARY


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("canary_percent", -1),
        ("canary_percent", 100.5),
        ("canary_percent", "10"),
        ("id", ""),
        ("version", "1"),  # equals the baseline
        ("sticky", "yes"),
        ("state", "full"),
    ],
)
def test_invalid_rollout_fields_are_named(field: str, value: object) -> None:
    with pytest.raises(InvalidConfig, match=field if field != "version" else "baseline_version"):
        rollout(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_samples", 0),
        ("min_samples", 2.5),
        ("max_acceptance_drop", 1.5),
        ("max_acceptance_drop", "0.1"),
        ("max_latency_regression", -0.1),
        ("window", -1),
    ],
)
def test_invalid_guard_fields_are_named(field: str, value: object) -> None:
    with pytest.raises(InvalidConfig, match=field):
        Guard(**{field: value})  # type: ignore[arg-type]


def test_guard_window_must_cover_min_samples_and_unknown_field() -> None:
    with pytest.raises(InvalidConfig, match="window"):
        Guard(min_samples=100, window=50)
    with pytest.raises(InvalidConfig, match="unknown field 'min_sample'"):
        Guard.from_dict({"min_sample": 10})
    assert Guard.from_dict({"min_samples": 10}) == Guard(min_samples=10)


def test_from_dict_rejects_unknown_and_missing_fields() -> None:
    data = rollout().to_dict()
    with pytest.raises(InvalidConfig, match="unknown field 'colour'"):
        Rollout.from_dict({**data, "colour": 1})
    del data["canary_percent"]
    with pytest.raises(InvalidConfig, match="missing field 'canary_percent'"):
        Rollout.from_dict(data)


@given(
    state=st.sampled_from(list(S)),
    percent=st.floats(0, 100, allow_nan=False),
    sticky=st.booleans(),
    baseline=st.one_of(st.none(), st.sampled_from(["1", "3"])),
    min_samples=st.integers(1, 1000),
    drop=st.floats(0, 1),
)
def test_serialisation_round_trip(
    state: RolloutState,
    percent: float,
    sticky: bool,
    baseline: str | None,
    min_samples: int,
    drop: float,
) -> None:
    r = Rollout(
        id="r-7",
        target="t",
        draft="d",
        version="2",
        baseline_version=baseline,
        canary_percent=percent,
        sticky=sticky,
        state=state,
        guard=Guard(min_samples=min_samples, max_acceptance_drop=drop, window=0),
        reason="why",
    )
    data = json.loads(json.dumps(r.to_dict()))
    assert data["state"] == state.value
    assert Rollout.from_dict(data) == r
