"""Group commit off the request path.

``await writer.write(record, payload)`` returns the record id once it is durable. Writes that
arrive while a transaction is in flight queue up and go into the next one (up to
``max_batch``); under concurrency the loop also lingers up to ``max_delay_ms`` to fill a batch.
A lone writer never lingers, so its added latency is one commit.

Fail closed: any failure to commit raises :class:`AuditUnavailable` in every waiting
``write``. A batch rejected for one bad row (IntegrityError/DataError) is retried row by row,
so only the bad record fails. ``stop()`` flushes everything queued before it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sqlalchemy.exc import DataError, IntegrityError

from gateway.database.audit.records import Entry, entry_row
from gateway.database.audit.types import AuditUnavailable, Payload, WriterStats
from gateway.database.base import utcnow
from gateway.database.store import Database


@dataclass
class _Item:
    record: Entry
    payload: Payload | None
    future: asyncio.Future[int]


_STOP = object()


class AuditWriter:
    def __init__(self, store: Database, *, max_batch: int = 64, max_delay_ms: float = 5) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self._store = store
        self._max_batch = max_batch
        self._max_delay = max_delay_ms / 1000
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._last_batch = 0
        self.stats = WriterStats()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closed

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="audit-writer")

    async def write(self, record: Entry, payload: Payload | None = None) -> int:
        """Queue one record (or admission) and wait until it is committed; returns its id.
        ValueError for an invalid record (checked before queueing), AuditUnavailable when it
        cannot be stored."""
        if not self.running:
            raise AuditUnavailable("audit writer is not running")
        entry_row(record, payload, utcnow())  # validate now: a bad row never joins a batch
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(record, payload, future))
        return await future

    async def stop(self) -> None:
        """Stop accepting writes, commit everything already queued, then return."""
        if self._task is None or self._closed:
            return
        self._closed = True
        self._queue.put_nowait(_STOP)
        await self._task

    async def _run(self) -> None:
        stopping = False
        try:
            while not stopping:
                first = await self._queue.get()
                if first is _STOP:
                    break
                batch, stopping = await self._gather(first)
                await self._flush(batch)
        finally:
            self._fail_queued()

    async def _gather(self, first: object) -> tuple[list[_Item], bool]:
        assert isinstance(first, _Item)
        batch = [first]
        await asyncio.sleep(0)  # let writers that are ready now enqueue
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self._max_delay if self._last_batch > 1 else 0)
        while len(batch) < self._max_batch:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            if item is _STOP:
                return batch, True
            assert isinstance(item, _Item)
            batch.append(item)
        return batch, False

    async def _flush(self, batch: list[_Item]) -> None:
        self._last_batch = len(batch)
        try:
            ids = await self._store.append([(i.record, i.payload) for i in batch])
        except AuditUnavailable as exc:
            self._count(len(batch), failed=True)
            if len(batch) > 1 and isinstance(exc.__cause__, IntegrityError | DataError):
                for item in batch:
                    await self._flush([item])
                return
            for item in batch:
                _settle(item.future, exc=exc)
            return
        except Exception as exc:  # programming error: still fail closed, never hang a caller
            self._count(len(batch), failed=True)
            for item in batch:
                _settle(item.future, exc=AuditUnavailable(f"audit write failed: {exc!r}"))
            return
        self._count(len(batch), failed=False)
        for item, rid in zip(batch, ids, strict=True):
            _settle(item.future, result=rid)

    def _count(self, n: int, *, failed: bool) -> None:
        s = self.stats
        self.stats = WriterStats(
            records=s.records + (0 if failed else n),
            transactions=s.transactions + 1,
            failures=s.failures + (1 if failed else 0),
            largest_batch=max(s.largest_batch, n),
        )

    def _fail_queued(self) -> None:
        self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if isinstance(item, _Item):
                _settle(item.future, exc=AuditUnavailable("audit writer stopped"))


def _settle(
    future: asyncio.Future[int], *, result: int | None = None, exc: Exception | None = None
) -> None:
    if future.done():  # the caller was cancelled; the record is stored regardless
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        assert result is not None
        future.set_result(result)
