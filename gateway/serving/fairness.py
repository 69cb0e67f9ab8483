"""Fair sharing of the inference worker across tenants.

One tenant's requests, inside its limits, must not slow, starve or stop another's. Three
mechanisms, each bounded by the tenant's policy (`fairness` in its document):

- **Caps.** A tenant holds at most `max_concurrent_requests` requests in flight
  (`RequestSlots`, a 429 past it), `max_rows` rows of the batches (by default the whole
  batch where preemption below gives an arriving tenant its share, else three quarters of
  it, a row fewer than all at least: `default_max_rows`) and `max_queued` jobs waiting
  for a row (`FairQueue`, a 503 to that tenant past it; by default the whole queue, which
  the share-aware refusals below keep open to the others).
- **Fair admission (VTC).** When a row frees, it goes to the backlogged tenant with the
  fewest virtual tokens served (the Virtual Token Counter of Sheng et al., "Fairness in
  Serving Large Language Models", OSDI 2024): each tenant's counter grows by its weighted
  tokens (prompt tokens computed x 1, a kept prefix not counted; output tokens x 2, as in
  the paper) divided by its policy `weight`. A tenant that starts waiting after being idle
  has its counter lifted to the least counter of the tenants being served, so idleness
  banks no credit. Between two tenants that stay backlogged, the counters part by at most
  what one admission adds before the other is picked again: one request row's weighted
  tokens (prompt + 2 x max_tokens) over its weight, the paper's bound with one row per
  admission.
- **Preemption** (serving/batches.py `Batches.preemptible`). When a job waits in its turn
  and its batch is full, its tenant holds fewer rows of the batch than its weighted share
  (the batch's rows x its weight over the weights of the tenants holding rows and its own)
  and another tenant holds more than its share, the row that tenant admitted last is parked
  (engine `Batch.park`: its keys and values copied out of the slot) and the job takes the
  slot. The parked job waits at the front of its tenant's queue (`requeue`) and resumes,
  bit for bit where it stopped, in its tenant's turn when a row frees. An arrival never
  waits for a long request to end, and a tenant alone uses the whole batch. A batch's
  parked rows are at most its rows (one more batch's worth of keys and values); a failed
  park (out of memory) leaves everything as it was. Its record says it waited for fairness.
- **Fair steps** (`StepPacer`). A row holds its slot until its request ends, so admission
  alone cannot keep a long request's rows from slowing another tenant's: on a CPU a step
  costs about in proportion to its rows and their contexts. So each batch step's time is
  charged to the tenants whose rows took it (an equal share per row, over the tenant's
  weight), and each step only the rows of the tenant whose charged time is least step
  (those of tenants level with it too); the others sit the step out, keeping their slots
  and caches. One tenant a step: a row stepping beside another tenant's would wait for that
  step's whole cost and be charged a part of it. Time, not tokens: a token of a long
  context, or of a row that drafts little, costs the worker more. A tenant alone in its
  batch never sits out (the capacity nobody else uses stays its). One that joins a batch
  keeps its own time, but at least the least time of those already in it less
  `JOIN_CREDIT_S`: a tenant back after a while steps first for up to that long (an ordinary
  request then runs at about its speed alone), and nothing more is banked while away.
  Between two tenants decoding together the times part by at most `JOIN_CREDIT_S` plus one
  step.
- **Share-aware refusals.** A full queue refuses the arrival only when its tenant holds at
  least its equal share of the queue (capacity / backlogged tenants); otherwise the newest
  job of the tenant holding the most jobs past its share is evicted (it ends with
  ``Overloaded``, a 503 to that tenant) and the arrival takes its place.

A job whose request was cancelled while it waited (client gone) is dropped at the next
admission without running. The worker thread picks and charges; the event loop offers:
both under one lock.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.serving.errors import GatewayError
from policies.document import Fairness

FAIR_WAIT = "fairness.waited"
"""Reason code the audit record carries when a row of the request was held back so that
another tenant's ran first (or because its tenant held its row cap while a row was free)."""
PROMPT_WEIGHT = 1.0
OUTPUT_WEIGHT = 2.0
PACE_LEAD_S = 0.0
"""Worker seconds (over weight) a tenant's charged time may lead the least among the tenants
decoding in its batch before its rows sit a step out (`StepPacer.pace`): none, one tenant
a step."""
JOIN_CREDIT_S = 0.25
"""Worker seconds (over weight) a tenant joining a batch may start behind the least time of
those in it (`StepPacer.pace`): the burst an ordinary request gets on arrival."""


class Overloaded(Exception):
    """The queue (or the tenant's share of it) is full; retry after ``retry_after`` s."""

    def __init__(self, depth: int, retry_after: int = 1, detail: str | None = None) -> None:
        super().__init__(detail or f"the inference queue is full ({depth} waiting); retry shortly")
        self.depth = depth
        self.retry_after = retry_after


@dataclass(frozen=True)
class Share:
    """A job's tenant and what its policy grants it on the worker. None: the worker's
    default (see `FairQueue`)."""

    tenant: str
    weight: float = 1.0
    max_rows: int | None = None
    max_queued: int | None = None


SYSTEM = Share("", weight=1.0, max_rows=1 << 30, max_queued=1 << 30)
"""Jobs no tenant sent (the regression gate's replay): uncapped, but still in turn."""


def share_of(tenant: str, fairness: Fairness) -> Share:
    return Share(tenant, fairness.weight, fairness.max_rows, fairness.max_queued)


def default_max_rows(max_batch: int, preempt: bool = True) -> int:
    """The whole batch where preemption gives an arriving tenant its share; else three
    quarters of it and at least one row fewer than all of it (one row when the batch has
    one or two), so that another tenant's arrival finds a row."""
    if preempt:
        return max(1, max_batch)
    return max(1, min(max_batch - 1, math.ceil(max_batch * 3 / 4)))


class Waiting(Protocol):
    """What the queue reads of a job (serving/jobs.py `Job`)."""

    share: Share
    submitted_ns: int
    cancelled: threading.Event
    fair_wait: bool
    parked: Any
    """Not None: a running job whose row was parked to make room for another tenant's; it
    waits at the front of its tenant's queue to resume."""


class FairQueue:
    """The jobs waiting for a row, per tenant, and each tenant's virtual tokens served."""

    def __init__(self, capacity: int, max_batch: int, preempt: bool = True) -> None:
        self.capacity = capacity
        self.default_rows = default_max_rows(max_batch, preempt)
        self.default_queued = capacity  # shared: a full queue evicts past a share
        self._lock = threading.Lock()
        self._queues: dict[str, collections.deque[Any]] = {}
        self._served: dict[str, float] = collections.defaultdict(float)
        self._running: dict[str, int] = collections.defaultdict(int)
        self._floor = 0.0  # the counter of the last tenant to go idle
        self.waiting = 0  # jobs waiting for a first row
        self.parked = 0  # parked jobs waiting to resume (first in their tenants' queues)

    # -- event-loop side ----------------------------------------------------------------

    def offer(self, job: Waiting) -> Any | None:
        """Queue ``job``; returns the job evicted to make room (None if none). Raises
        ``Overloaded`` when the job's tenant holds its cap or its share of a full queue."""
        share = job.share
        t = share.tenant
        with self._lock:
            queue = self._queues.setdefault(t, collections.deque())
            cap = share.max_queued or self.default_queued
            queued = self._queued(t)
            if queued >= cap:
                raise Overloaded(
                    self.waiting,
                    detail=f"tenant {t} already has {queued} jobs waiting for the "
                    f"inference worker, its cap ({cap}); retry shortly",
                )
            evicted = None
            if self.waiting >= self.capacity:
                evicted = self._evict_for(t)
            if not queue and not self._running[t]:
                self._lift(t)
            queue.append(job)
            self.waiting += 1
            return evicted

    def _evict_for(self, tenant: str) -> Any:
        """The newest job of the tenant most past its equal share, or Overloaded when
        `tenant` is itself at its share (or nobody is past theirs)."""
        backlogged = {u for u in self._queues if self._queued(u)} | {tenant}
        share = self.capacity / len(backlogged)
        mine = self._queued(tenant)
        over = max((u for u in backlogged if u != tenant), key=self._queued, default=None)
        if mine >= share or over is None or self._queued(over) <= share:
            raise Overloaded(self.waiting)
        self.waiting -= 1
        evicted = self._queues[over].pop()  # the newest: parked jobs are at the front
        self._idle_check(over)
        return evicted

    def _queued(self, tenant: str) -> int:
        """The tenant's jobs waiting for a first row (its parked ones not counted)."""
        return sum(1 for j in self._queues.get(tenant, ()) if j.parked is None)

    def requeue(self, job: Waiting) -> None:
        """A picked job back to the front of its tenant's queue: one whose row was parked
        (serving/batches.py `Batches.park`) resumes before the tenant's new jobs, in the
        tenant's turn, and counts against neither the queue's capacity nor the tenant's
        ``max_queued``, and is never evicted; one that could not be admitted after all (a
        preemption that failed) waits as it did."""
        with self._lock:
            t = job.share.tenant
            self._queues.setdefault(t, collections.deque()).appendleft(job)
            self._running[t] -= 1
            if job.parked is None:
                self.waiting += 1
            else:
                self.parked += 1

    def _lift(self, tenant: str) -> None:
        """A tenant starting to wait after idling: no credit banked while idle. Lifted to
        the least counter of the tenants waiting or running, or, when none is, to the
        counter of the last tenant that went idle (as VTC does when its queue is empty)."""
        active = [
            self._served[u]
            for u in set(self._queues) | set(self._running)
            if u != tenant and (self._queues.get(u) or self._running.get(u))
        ]
        floor = min(active) if active else self._floor
        self._served[tenant] = max(self._served[tenant], floor)

    def _idle_check(self, tenant: str) -> None:
        """Called when a tenant's queue or rows shrank: gone idle, its counter is the floor
        an arrival into an empty worker is lifted to."""
        if not self._queues.get(tenant) and not self._running.get(tenant):
            self._floor = max(self._floor, self._served[tenant])

    # -- worker-thread side -------------------------------------------------------------

    def pick(
        self, fits: Callable[[Any], bool], default_cap: Callable[[Any], int] | None = None
    ) -> tuple[Any | None, list[Any]]:
        """The next job to admit, and the cancelled jobs dropped from the queue. The next
        job is the head of the backlogged tenant with the fewest virtual tokens served
        (ties: the older head) that is under its row cap and ``fits`` (its batch has room,
        or a row it may take by preemption).
        ``default_cap(job)``: the row cap of a job whose tenant's policy sets none
        (default: `default_max_rows` of the worker's max_batch)."""
        with self._lock:
            dropped = self._drop_cancelled()
            heads = sorted(  # a tie (a counter just lifted) goes to the fewer rows held
                (self._served[t], self._running[t], q[0].submitted_ns, t)
                for t, q in self._queues.items()
                if q
            )
            held: list[Any] = []
            for *_, t in heads:
                head = self._queues[t][0]
                if not fits(head):
                    continue
                cap = head.share.max_rows or (
                    default_cap(head) if default_cap else self.default_rows
                )
                if self._running[t] >= cap:
                    held.append(head)  # a row is free, but not for this tenant now
                    continue
                self._queues[t].popleft()
                self._count_out(head)
                self._running[t] += 1
                for other in held:
                    other.fair_wait = True
                for *_, u in heads:  # an older head FIFO would have taken first
                    q = self._queues[u]
                    if u != t and q and q[0].submitted_ns < head.submitted_ns and fits(q[0]):
                        q[0].fair_wait = True
                return head, dropped
            for other in held:
                other.fair_wait = True
            return None, dropped

    def _drop_cancelled(self) -> list[Any]:
        dropped = []
        for t, q in self._queues.items():
            if any(j.cancelled.is_set() for j in q):
                kept = collections.deque(j for j in q if not j.cancelled.is_set())
                dropped += [j for j in q if j.cancelled.is_set()]
                self._queues[t] = kept
                self._idle_check(t)
        for job in dropped:
            self._count_out(job)
        return dropped

    def _count_out(self, job: Waiting) -> None:
        if job.parked is None:
            self.waiting -= 1
        else:
            self.parked -= 1

    def charge(self, share: Share, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        """Tokens served to a tenant's row, weighted, over the tenant's weight."""
        cost = PROMPT_WEIGHT * prompt_tokens + OUTPUT_WEIGHT * output_tokens
        with self._lock:
            self._served[share.tenant] += cost / share.weight

    def release(self, share: Share) -> None:
        """A running row of the tenant ended."""
        with self._lock:
            self._running[share.tenant] -= 1
            self._idle_check(share.tenant)

    def served(self, tenant: str) -> float:
        with self._lock:
            return self._served[tenant]


class StepPacer:
    """Fair steps: the worker time each tenant's rows took in each batch, and who sits the
    next step out (see the module's docstring). Worker-thread only."""

    def __init__(self) -> None:
        self._spent: dict[str, float] = collections.defaultdict(float)
        self._present: dict[object, frozenset[str]] = {}  # per batch: tenants last paced
        self._floor: dict[object, float] = collections.defaultdict(float)  # per batch

    def pace(self, batch: object, shares: Sequence[Share]) -> set[str]:
        """Of the tenants with rows in ``batch`` (one share per row), those whose rows sit
        this step out: each whose time leads the least of them by more than
        `PACE_LEAD_S`. None when fewer than two tenants share the batch.

        A tenant joining the batch is lifted to the least time of the tenants that stayed
        in it less `JOIN_CREDIT_S` (a bounded burst), or, when none stayed, to the time of
        the last tenant that left it: nothing more is banked while away, and a tenant that
        had the batch to itself carries no lead into the next tenant's arrival (without the
        floor, a tenant returning to an emptied batch would keep an old, low time, and the
        one that had used the idle worker would sit out until it caught up)."""
        present = {s.tenant for s in shares}
        before = self._present.get(batch, frozenset())
        self._present[batch] = frozenset(present)
        for t in before - present:  # left the batch
            self._floor[batch] = max(self._floor[batch], self._spent[t])
        stayed = [self._spent[t] for t in present & before]
        level = min(stayed) - JOIN_CREDIT_S if stayed else self._floor[batch]
        for t in present - before:  # joined the batch
            self._spent[t] = max(self._spent[t], level)
        if len(present) < 2:
            return set()
        least = min(self._spent[t] for t in present)
        return {t for t in present if self._spent[t] > least + PACE_LEAD_S}

    def spend(self, shares: Sequence[Share], seconds: float) -> None:
        """A step of ``seconds`` taken by these rows (one share each): an equal part each,
        over its tenant's weight."""
        if not shares:
            return
        part = seconds / len(shares)
        for share in shares:
            self._spent[share.tenant] += part / share.weight

    def forget(self, batch: object) -> None:
        for t in self._present.pop(batch, frozenset()):
            self._floor[batch] = max(self._floor[batch], self._spent[t])

    def spent(self, tenant: str) -> float:
        return self._spent.get(tenant, 0.0)


class RequestSlots:
    """Each tenant's requests in flight (started, not yet finished), capped by its policy's
    `max_concurrent_requests`. Event-loop only."""

    def __init__(self) -> None:
        self._held: dict[str, int] = collections.defaultdict(int)

    def acquire(self, tenant: str, cap: int | None) -> None:
        self.check(tenant, cap)
        self._held[tenant] += 1

    def check(self, tenant: str, cap: int | None) -> None:
        """The 429 a tenant at its cap gets (checked again before any work is spent on a
        request, and when its slot is taken)."""
        if cap is not None and self._held[tenant] >= cap:
            raise GatewayError(
                "rate_limited",
                f"tenant {tenant} already has {self._held[tenant]} requests in flight, "
                f"its limit ({cap}); retry when one finishes",
                code="concurrency_limit_exceeded",
                retry_after=1,
            )

    def release(self, tenant: str | None) -> None:
        if tenant is not None and self._held.get(tenant, 0) > 0:
            self._held[tenant] -= 1

    def held(self, tenant: str) -> int:
        return self._held.get(tenant, 0)
