"""Fair admission across tenants (serving/fairness.py): least virtual tokens served first,
caps per tenant, share-aware refusals. Each property is also run against the FIFO the
worker used before, which must fail it (the negative control)."""

from __future__ import annotations

import collections
import itertools
import random
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.serving.errors import GatewayError
from gateway.serving.fairness import (
    FairQueue,
    Overloaded,
    RequestSlots,
    Share,
    default_max_rows,
)

_clock = itertools.count()


@dataclass
class J:
    share: Share
    submitted_ns: int = field(default_factory=lambda: next(_clock))
    cancelled: threading.Event = field(default_factory=threading.Event)
    fair_wait: bool = False
    parked: Any = None


class Fifo:
    """The worker's admission before: one line for everyone, no caps but the capacity."""

    def __init__(self, capacity: int, max_batch: int) -> None:
        self.capacity, self.line = capacity, collections.deque[Any]()

    def offer(self, job: J) -> None:
        if len(self.line) >= self.capacity:
            raise Overloaded(len(self.line))
        self.line.append(job)

    def pick(self, fits: Any) -> tuple[Any, list[Any]]:
        for job in self.line:
            if fits(job):
                self.line.remove(job)
                return job, []
        return None, []

    def charge(self, share: Share, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        pass

    def release(self, share: Share) -> None:
        pass


HOG, VICTIM = Share("hog", max_rows=8), Share("victim")  # the hog may take the whole batch


def victim_waits_for_a_hog_row(queue: Any, max_batch: int = 8) -> bool:
    """A hog fills the batch and keeps a backlog; a victim arrives; one round later, does the
    victim hold a row (True) or wait behind the hog's backlog (False)?"""
    running = 0
    for _ in range(max_batch + 4):
        queue.offer(J(HOG))
    while running < max_batch:
        job, _ = queue.pick(lambda j: True)
        if job is None:
            break
        running += 1
        queue.charge(job.share, prompt_tokens=10, output_tokens=50)
    victim = J(VICTIM)
    queue.offer(victim)
    queue.charge(HOG, output_tokens=8)  # the hog's rows step on meanwhile
    free = running < max_batch
    if not free:  # a hog row ends: the freed row goes to ...
        queue.release(HOG)
    job, _ = queue.pick(lambda j: True)
    return job is victim


@pytest.mark.parametrize("impl, expected", [(FairQueue, True), (Fifo, False)])
def test_an_arriving_tenant_gets_the_next_row(impl: Any, expected: bool) -> None:
    assert victim_waits_for_a_hog_row(impl(32, 8)) is expected


def test_the_row_cap_leaves_rows_to_others() -> None:
    q = FairQueue(32, 8)
    assert default_max_rows(8) == 8 and default_max_rows(1) == 1  # preemption makes room
    hog = Share("hog", max_rows=6)  # a cap in the tenant's policy
    for _ in range(10):
        q.offer(J(hog))
    picked = [q.pick(lambda j: True)[0] for _ in range(8)]
    assert sum(p is not None for p in picked) == 6  # two rows stay free
    held = q._queues["hog"][0]
    assert held.fair_wait  # a row was free, its tenant held its cap: the record says so
    victim = J(VICTIM)
    q.offer(victim)
    assert q.pick(lambda j: True)[0] is victim and not victim.fair_wait


def test_least_served_first_and_older_heads_marked() -> None:
    q = FairQueue(32, 8)
    old = J(HOG)
    q.offer(old)
    q.charge(HOG, output_tokens=1000)
    new = J(VICTIM)
    q.offer(new)  # lifted to the least counter of the active tenants: the hog's
    q.charge(HOG, output_tokens=1)  # the hog was served since
    assert q.pick(lambda j: True)[0] is new
    assert old.fair_wait  # FIFO would have taken it first


def test_the_default_cap_follows_the_jobs_batch() -> None:
    """A batch cut to 2 rows (a KV budget): the default cap is those 2 rows."""
    q = FairQueue(32, 8)
    hog = Share("hog")
    for _ in range(4):
        q.offer(J(hog))
    picked = [q.pick(lambda j: True, lambda j: 2)[0] for _ in range(3)]
    assert picked[0] is not None and picked[1] is not None and picked[2] is None


def test_an_arrival_into_an_idle_worker_is_lifted_to_the_last_to_leave() -> None:
    """A tenant that went idle with a large counter, then an arrival into the empty
    worker: the arrival may not bank the difference as credit against its return."""
    q = FairQueue(32, 8)
    q.offer(J(HOG))
    q.pick(lambda j: True)
    q.charge(HOG, output_tokens=5000)
    q.release(HOG)  # the hog goes idle
    q.offer(J(VICTIM))
    assert q.served("victim") == q.served("hog") == 10000


def test_an_idle_tenant_banks_no_credit() -> None:
    q = FairQueue(32, 8)
    q.offer(J(HOG))
    q.pick(lambda j: True)
    q.charge(HOG, output_tokens=5000)
    q.offer(J(VICTIM))
    assert q.served("victim") == q.served("hog") == 10000


def test_weights_share_the_tokens_served() -> None:
    heavy, light = Share("heavy", weight=2.0), Share("light", weight=1.0)
    q = FairQueue(64, 8)
    tokens = collections.Counter[str]()
    for _ in range(20):
        q.offer(J(heavy))
        q.offer(J(light))
    for _ in range(30):  # one row at a time, each row 100 output tokens
        job, _ = q.pick(lambda j: True)
        q.charge(job.share, output_tokens=100)
        tokens[job.share.tenant] += 100
        q.release(job.share)
        q.offer(J(job.share))  # both stay backlogged
    assert tokens["heavy"] == pytest.approx(2 * tokens["light"], rel=0.1)


def test_backlogged_counters_stay_within_one_admission() -> None:
    """The VTC bound: tenants that stay backlogged never part by more than what one
    admission charges (one row's weighted tokens over its weight)."""
    rng = random.Random(7)
    shares = [Share(f"t{i}", weight=rng.choice([0.5, 1.0, 3.0])) for i in range(4)]
    q = FairQueue(1000, 8)
    for s in shares:
        for _ in range(5):
            q.offer(J(s))
    biggest = 0.0
    for _ in range(400):
        job, _ = q.pick(lambda j: True)
        prompt, out = rng.randint(1, 200), rng.randint(1, 300)
        q.charge(job.share, prompt_tokens=prompt, output_tokens=out)
        biggest = max(biggest, (prompt + 2 * out) / job.share.weight)
        q.release(job.share)
        q.offer(J(job.share))
        counters = [q.served(s.tenant) for s in shares]
        assert max(counters) - min(counters) <= biggest + 1e-9


def test_a_tenant_is_refused_at_its_queue_cap_not_others() -> None:
    q = FairQueue(8, 8)
    hog = Share("hog", max_queued=4)
    for _ in range(4):
        q.offer(J(hog))
    with pytest.raises(Overloaded, match="tenant hog"):
        q.offer(J(hog))
    q.offer(J(VICTIM))  # the rest of the queue is the others'


@pytest.mark.parametrize("impl", [FairQueue, Fifo])
def test_a_full_queue_refuses_the_tenant_over_its_share(impl: Any) -> None:
    a, b, c = Share("a", max_queued=4), Share("b", max_queued=4), Share("c")
    q = impl(4, 8)
    queued = [J(a), J(a), J(b), J(b)]
    for j in queued:
        q.offer(j)
    if impl is Fifo:  # the old line refused whoever came last
        with pytest.raises(Overloaded):
            q.offer(J(c))
        return
    evicted = q.offer(J(c))  # c holds nothing, a and b each past the share of 4/3
    assert evicted in (queued[1], queued[3])  # the newest of a tenant past its share
    assert q.offer(J(c)) is not None  # still under its share
    with pytest.raises(Overloaded):  # now at it: c is refused, not a or b
        q.offer(J(c))


def test_cancelled_waiting_jobs_are_dropped_without_running() -> None:
    q = FairQueue(8, 8)
    gone, kept = J(HOG), J(VICTIM)
    q.offer(gone)
    q.offer(kept)
    gone.cancelled.set()
    job, dropped = q.pick(lambda j: True)
    assert job is kept and dropped == [gone] and q.waiting == 0


def test_concurrent_requests_cap() -> None:
    slots = RequestSlots()
    slots.acquire("t", 2)
    slots.acquire("t", 2)
    with pytest.raises(GatewayError) as err:
        slots.acquire("t", 2)
    assert err.value.code == "concurrency_limit_exceeded"
    slots.acquire("u", 2)  # another tenant is not affected
    slots.release("t")
    slots.acquire("t", 2)
    slots.acquire("t", None)  # null: unlimited
