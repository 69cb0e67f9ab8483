"""Preemption (serving/fairness.py, serving/batches.py `preemptible`): a tenant alone takes
the whole batch, and an arriving tenant under its share of the rows takes one from the
tenant furthest past its share at once: that row is parked (its keys and values copied out)
and resumes in its tenant's turn, decoding exactly what it decodes alone. Checked on the
fair queue (a parked job resumes first, is never evicted, costs no queue place) and on the
real worker with a tiny model; the negative control turns preemption off: the arrivals
then wait for the hog's long rows to end."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.engine import Finished
from gateway.engine.batch.slots import SlotCache
from gateway.serving.fairness import FairQueue, Overloaded, Share
from tests.support.worker import counted_engine, started
from tests.unit.serving.test_fairness import J

BATCH = 4


def test_a_parked_job_resumes_first_costs_no_queue_place_and_is_never_evicted() -> None:
    q = FairQueue(capacity=2, max_batch=BATCH)
    hog = Share("hog", max_queued=1)
    running = J(hog)
    q.offer(running)
    assert q.pick(lambda j: True)[0] is running
    newer = J(hog)
    q.offer(newer)  # the hog's one queued place
    running.parked = object()  # its row was parked for another tenant's job
    q.requeue(running)
    assert (q.waiting, q.parked) == (1, 1)
    victim = J(Share("victim"))
    q.offer(victim)  # the queue is full now (2 waiting), the parked job not counted
    with pytest.raises(Overloaded):
        q.offer(J(hog))  # the hog is at its cap of 1 queued job: its parked one is not counted
    evicted = q.offer(J(Share("third")))  # a full queue evicts past a share: never the parked
    assert evicted is newer or evicted is victim
    assert evicted is not running
    q.charge(Share("victim"), output_tokens=10**6)  # the hog's turn comes first
    q.charge(Share("third"), output_tokens=10**6)
    assert q.pick(lambda j: True)[0] is running  # the parked job before the hog's newer one
    assert q.parked == 0


CASES = {
    "on": {},
    "off": {"preempt": False},  # the row cap leaves a row instead
    "unparkable": {"parkable": False},  # a backend whose memory cannot save a slot
    "off-whole-batch": {"preempt": False, "hog_rows": BATCH},  # the negative control
    "park-fails": {"save_fails": True},  # out of memory copying keys and values out
}


async def _run(tmp_path: Path, monkeypatch: Any, case: dict[str, Any]) -> dict[str, Any]:
    engine, decode_rows, request = counted_engine(tmp_path, monkeypatch)

    hogs = [request((5 + i, 6, 7), 160) for i in range(BATCH)]
    victims = [request((9, 10 + i, 11, 12), 12) for i in range(3)]
    worker = started(max_active=BATCH, max_batch=BATCH)
    monkeypatch.setattr(worker, "preempt", case.get("preempt", True))
    if not case.get("parkable", True):
        monkeypatch.setattr(SlotCache, "parkable", False)
    if case.get("save_fails"):

        def fail(self: SlotCache, slot: int) -> None:
            raise RuntimeError("out of memory (simulated)")

        monkeypatch.setattr(SlotCache, "save", fail)
    hog = Share("hog", max_rows=case.get("hog_rows"))
    order: list[str] = []
    try:
        hog_jobs = [worker.submit_decode(engine, r, share=hog) for r in hogs]
        hog_events = [worker.events(j) for j in hog_jobs]
        await asyncio.wait_for(anext(hog_events[0]), timeout=60)
        while len(decode_rows) < 8:  # the hog's rows step on a while, alone
            await asyncio.sleep(0.01)
        hog_rows_alone = max(decode_rows)

        async def finish(events: Any, tag: str) -> list[int]:
            got = [e async for e in events]
            assert isinstance(got[-1], Finished)
            order.append(tag)
            return list(got[-1].result.token_ids)

        victim_jobs = [worker.submit_decode(engine, r, share=Share("victim")) for r in victims]
        results = await asyncio.wait_for(asyncio.gather(
            *(finish(e, "hog") for e in hog_events),
            *(finish(worker.events(j), "victim") for j in victim_jobs),
        ), timeout=240)  # fmt: skip
        alive = worker._thread.is_alive()
    finally:
        worker.stop()
    # Exact, parked or not: every row decodes what it decodes alone.
    assert results == [list(engine.run(r).token_ids) for r in [*hogs, *victims]]
    return {
        "hog_rows_alone": hog_rows_alone,
        "victims_before_any_hog": order[:3] == ["victim"] * 3,
        "preemptions": worker.preemptions,
        "hog_waited": sum(j.fair_wait for j in hog_jobs),
        "worker_alive": alive,
    }


@pytest.mark.parametrize("name", list(CASES))
async def test_an_arrival_takes_a_row_from_a_tenant_past_its_share(
    tmp_path: Path, monkeypatch: Any, name: str
) -> None:
    """With preemption a tenant alone holds the whole batch and arrivals are still served
    first. Without it (``off``, ``unparkable``) the default cap leaves a row for them; the
    negative control, without preemption and a hog allowed the whole batch, makes them wait
    for the hog. A preemption that fails leaves everything as it was: the worker goes on and
    the arrivals wait for a hog row."""
    seen = await _run(tmp_path, monkeypatch, CASES[name])
    assert seen["worker_alive"], seen
    if name == "on":
        # the victim's share of 4 rows beside the hog is 2: two hog rows parked at once (a
        # parked row that resumes while a victim request waits may be parked again)
        assert seen["hog_rows_alone"] == BATCH and seen["victims_before_any_hog"], seen
        assert seen["preemptions"] >= 2 and seen["hog_waited"] >= 2, seen
    elif name in ("off", "unparkable"):
        assert seen["hog_rows_alone"] == BATCH - 1 and seen["victims_before_any_hog"], seen
        assert seen["preemptions"] == 0, seen
    else:  # off-whole-batch, park-fails
        assert seen["hog_rows_alone"] == BATCH and not seen["victims_before_any_hog"], seen
        assert seen["preemptions"] == 0, seen
