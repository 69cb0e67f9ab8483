"""Fair steps (serving/fairness.py `StepPacer`): a row holds its slot until its request ends,
so a tenant that came first with many long rows would slow every step another tenant's row
takes. Each step's time is charged to the tenants whose rows took it, and the rows of a
tenant whose time leads the batch's least by more than PACE_LEAD_S (none: one tenant a
step) sit the step out; a tenant joining a batch starts up to JOIN_CREDIT_S behind.
Checked on the pacer alone (its bound over random steps) and on the real worker with a tiny
model: the victim gets steps of its own, and every row, held or not, still decodes exactly
what it decodes alone. The negative controls turn the pacing off: the same checks then
fail."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from gateway.engine import DecodeRequest, Finished, SamplingParams
from gateway.serving import fairness
from gateway.serving.fairness import (
    JOIN_CREDIT_S,
    OUTPUT_WEIGHT,
    PACE_LEAD_S,
    Share,
    StepPacer,
)
from tests.support.worker import counted_engine, spied_engine, started

HOG_ROWS = 3


def test_pace_steps_the_tenant_with_the_least_time_and_a_joiner_first() -> None:
    p = StepPacer()
    a, b, heavy_b = Share("a"), Share("b"), Share("b", weight=2.0)
    assert p.pace(0, [a, a, a]) == set()  # alone: never held
    p.spend([a, a, a], 3.0)  # a's rows took the worker alone for 3 s
    assert p.pace(0, [a, a, b]) == {"a"}  # b joins JOIN_CREDIT_S behind a: b steps first
    assert p.spent("b") == pytest.approx(3.0 - JOIN_CREDIT_S)  # not 0: nothing more banked
    p.spend([b], JOIN_CREDIT_S)  # b's step alone brings it level
    assert p.pace(0, [a, a, b]) == set()  # level: both step
    p.spend([a, a, b], 0.03)  # a: 2 parts, b: 1
    assert p.pace(0, [a, a, b]) == {"a"}  # a leads by more than PACE_LEAD_S
    assert p.pace(0, [a]) == set()  # b left the batch
    assert p.pace(1, [a, b]) == {"a"}  # another batch: b is behind there too
    p.spend([heavy_b], 0.02)  # a weight of 2 charges half
    assert p.pace(1, [a, heavy_b]) == set()


def test_a_tenant_that_had_the_batch_alone_carries_no_lead_into_the_next_arrival() -> None:
    """The victim uses the idle worker for a long while and goes; the hog, back after an
    hour's pause with an old, low time, arrives in the emptied batch; the victim returns.
    Neither sits out for the victim's earlier use of the idle worker. The control (no
    floor: the hog keeps its old time) holds the victim back."""
    for floored in (True, False):
        p = StepPacer()
        hog, victim = Share("hog"), Share("victim")
        p.pace(0, [hog])
        p.spend([hog], 1.0)  # long ago
        p.pace(0, [victim])
        p.spend([victim], 30.0)  # the victim alone, a long while
        if not floored:
            p._present[0] = frozenset()  # forget who was there: no floor is set
        p.pace(0, [hog] * 6)  # the victim went, the hog came back
        assert (p.pace(0, [hog] * 6 + [victim] * 2) == set()) is floored


def test_paced_tenants_stay_within_the_bound_over_random_steps() -> None:
    """Three tenants with different row counts and step times: after every step, the
    times of the tenants in the batch part by at most the bound plus one step's part; the
    unpaced control (nobody sits out) parts far more."""
    rng = random.Random(3)
    for paced in (True, False):
        p, worst = StepPacer(), 0.0
        rows = [Share("hog")] * 6 + [Share("mid")] * 2 + [Share("one")]
        for _ in range(2000):
            sitting = p.pace(0, rows) if paced else set()
            taking = [s for s in rows if s.tenant not in sitting]
            seconds = 0.002 * len(taking) * rng.uniform(0.5, 2.0)
            p.spend(taking, seconds)
            times = [p.spent(t) for t in ("hog", "mid", "one")]
            worst = max(worst, max(times) - min(times))
        bounded = worst <= PACE_LEAD_S + 0.002 * 9 * 2.0
        assert bounded is paced, (paced, worst)


async def _run(tmp_path: Path, monkeypatch: Any, pacing: bool) -> dict[str, Any]:
    engine, decode_rows, request = counted_engine(tmp_path, monkeypatch)

    hogs = [request((5 + i, 6, 7), 160) for i in range(HOG_ROWS)]
    victim = request((9, 10, 11, 12), 48)
    # a bound of a few tiny-model steps, so that the victim's life holds many of them
    monkeypatch.setattr(fairness, "PACE_LEAD_S", 0.004)
    worker = started(max_active=8, max_batch=4)
    if not pacing:
        monkeypatch.setattr(worker, "fair_steps", False)
    try:
        hog_jobs = [worker.submit_decode(engine, r, share=Share("hog")) for r in hogs]
        hog_events = [worker.events(j) for j in hog_jobs]
        for events in hog_events:  # every hog row is decoding before the victim arrives
            await asyncio.wait_for(anext(events), timeout=60)
        first = len(decode_rows)
        job = worker.submit_decode(engine, victim, share=Share("victim"))
        got = [e async for e in worker.events(job)]
        lead = worker.pacer.spent("hog") - worker.pacer.spent("victim")
        during = decode_rows[first:]
        hog_results = []
        for events in hog_events:
            rest = [e async for e in events]
            assert isinstance(rest[-1], Finished)
            hog_results.append(rest[-1].result.token_ids)
    finally:
        worker.stop()
    assert isinstance(got[-1], Finished)
    # Exact whether held or not: every row decodes what it decodes alone.
    assert got[-1].result.token_ids == engine.run(victim).token_ids
    assert hog_results == [engine.run(r).token_ids for r in hogs]
    return {
        "victim_alone_steps": sum(1 for n in during if n == 1),
        "lead": lead,
        "hog_waited": all(j.fair_wait for j in hog_jobs),
        "victim_waited": job.fair_wait,
    }


@pytest.mark.parametrize("pacing", [True, False], ids=["paced", "control-unpaced"])
async def test_a_tenant_ahead_sits_steps_out_and_rows_stay_exact(
    tmp_path: Path, monkeypatch: Any, pacing: bool
) -> None:
    seen = await _run(tmp_path, monkeypatch, pacing)
    fair = (
        seen["victim_alone_steps"] > 0
        and seen["lead"] <= 0.004 + 0.5  # one step's part is milliseconds here
        and seen["hog_waited"]
        and not seen["victim_waited"]
    )
    assert fair is pacing, seen


async def test_a_reused_prompt_prefix_is_not_charged(tmp_path: Path, monkeypatch: Any) -> None:
    """The counter grows by the prompt tokens computed: the same tenant's second request on
    a kept prefix is charged only what it prefills (and its output)."""
    engine = spied_engine(tmp_path, monkeypatch, lambda *_: None)
    prompt = tuple(range(5, 45))
    req = DecodeRequest(
        prompt, SamplingParams(temperature=0.0, max_tokens=4), cache_scope="tenant:a"
    )  # fmt: skip
    worker = started(max_active=8, max_batch=4)
    charged = []
    try:
        for _ in range(2):
            before = worker.fair.served("a")
            events = [
                e async for e in worker.events(worker.submit_decode(engine, req, share=Share("a")))
            ]
            assert isinstance(events[-1], Finished)
            out = len(events[-1].result.token_ids)
            charged.append(worker.fair.served("a") - before - OUTPUT_WEIGHT * out)
    finally:
        worker.stop()
    assert charged[0] == len(prompt)  # the first prefills all of it
    assert charged[1] < len(prompt) / 4, charged  # the second reuses the kept prefix
