"""benchmarks/_phases.py (the step profile's timer): a phase's seconds exclude the phases
nested in it, so the phases of a step add up to the step, and compute inside a draft
phase counts as the draft's. A fake clock makes the seconds exact."""

from __future__ import annotations

import pytest
import torch

from benchmarks import _phases


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


def test_nested_phases_are_exclusive_and_add_up_to_the_outer_call(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(_phases.time, "perf_counter", clock)
    before = _phases.snapshot()
    compute = _phases._wrap(_phases.COMPUTE, lambda: clock.spend(0.020))

    def propose() -> None:
        clock.spend(0.003)
        compute()

    drafting = _phases._wrap("draft_propose", propose)

    def step() -> None:
        clock.spend(0.001)
        drafting()
        drafting()
        compute()

    _phases._wrap("step_other", step)()
    got = _phases.difference(_phases.snapshot(), before)
    s, calls = got["seconds"], got["calls"]
    assert calls["draft_compute"] == 2 and calls["target_compute"] == 1
    assert s["draft_compute"] == pytest.approx(0.040)
    assert s["target_compute"] == pytest.approx(0.020)
    assert s["draft_propose"] == pytest.approx(0.006)  # its own time only
    assert s["step_other"] == pytest.approx(0.001)
    assert sum(s.values()) == pytest.approx(clock.now)  # nothing counted twice


def test_a_compiled_steps_outer_head_counts_as_target_compute(monkeypatch) -> None:
    """The output head a compiled several-token step leaves to its caller (speed/steps.py)
    is the target's compute, not the forward's preparation."""
    from gateway.speed import steps

    for owner, attr, _ in _phases.targets():  # undone after the test
        monkeypatch.setattr(owner, attr, getattr(owner, attr))
    monkeypatch.setattr(_phases, "_installed", False)
    clock = Clock()
    monkeypatch.setattr(_phases.time, "perf_counter", clock)
    _phases.install()
    before = _phases.snapshot()

    def head(rows):
        clock.spend(0.005)
        return rows

    def prep() -> None:
        clock.spend(0.001)
        steps._outer_head(head, torch.zeros(1, 3, 2), range(1), [3], False)

    _phases._wrap("forward_prep", prep)()
    s = _phases.difference(_phases.snapshot(), before)["seconds"]
    assert s["target_compute"] == pytest.approx(0.005)
    assert s["forward_prep"] == pytest.approx(0.001)
