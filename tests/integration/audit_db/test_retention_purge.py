"""The payload purge on both backends: expired texts deleted in bounded transactions, each
recorded as a chained admin event, both chains still verifying; and the retention job."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest

from gateway.database import Database, Payload, RequestRecord
from gateway.database.audit.retention import PURGE_ACTION, PURGE_SUBJECT
from gateway.serving.retention import ACTOR, RetentionJob, start_retention


async def _seed(store: Database, make_record: Callable[..., RequestRecord]) -> list[int]:
    """Six records: payloads of 1 day on the first five, 30 days on the last."""
    return await store.append(
        [(make_record(i), Payload(f"p{i}", f"c{i}", 30 if i == 5 else 1)) for i in range(6)]
    )


async def test_purge_in_batches_each_recorded_chain_verifies(
    store: Database, make_record: Callable[..., RequestRecord], t0: datetime
) -> None:
    ids = await _seed(store, make_record)
    done = await store.purge_expired("ops:alice", t0 + timedelta(days=2), batch=2)
    assert done.purged == 5 and len(done.events) == 3  # 2 + 2 + 1
    for rid in ids[:5]:
        assert (await store.record(rid))["payload"] is None  # type: ignore[index]
    assert (await store.record(ids[5]))["payload"] is not None  # type: ignore[index]
    events, _ = await store.events(action=PURGE_ACTION)
    afters = sorted((e["after"] for e in events), key=lambda a: a["first_record_id"])
    assert [(a["purged"], a["first_record_id"], a["last_record_id"]) for a in afters] == [
        (2, ids[0], ids[1]),
        (2, ids[2], ids[3]),
        (1, ids[4], ids[4]),
    ]
    assert {(e["actor"], e["subject"]) for e in events} == {("ops:alice", PURGE_SUBJECT)}
    report = await store.verify()
    assert report["ok"] is True and report["checked"] == 6
    assert report["admin_events"]["checked"] == 3 and report["payloads"]["checked"] == 1


async def test_nothing_expired_writes_no_event_unless_asked(
    store: Database, make_record: Callable[..., RequestRecord], t0: datetime
) -> None:
    await _seed(store, make_record)
    done = await store.purge_expired("gateway:retention", t0)
    assert done.purged == 0 and done.events == ()
    assert (await store.events(action=PURGE_ACTION))[0] == []
    manual = await store.purge_expired("cli:bob", t0, record_empty=True)
    assert manual.purged == 0 and len(manual.events) == 1
    (event,) = (await store.events(action=PURGE_ACTION))[0]
    assert event["actor"] == "cli:bob" and event["after"]["purged"] == 0
    assert event["after"]["first_record_id"] is None


async def test_retention_job_run_once(
    store: Database, make_record: Callable[..., RequestRecord], t0: datetime
) -> None:
    await _seed(store, make_record)
    job = RetentionJob(store, interval_s=3600)
    assert (await job.run_once(t0 + timedelta(days=40))).purged == 6
    (event,) = (await store.events(action=PURGE_ACTION))[0]
    assert event["actor"] == ACTOR
    assert (await store.verify())["ok"] is True


def test_interval_checks() -> None:
    with pytest.raises(ValueError, match="RETENTION_INTERVAL_S"):
        start_retention(None, -1)  # type: ignore[arg-type]
    assert start_retention(None, 0) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RetentionJob(None, 0)  # type: ignore[arg-type]
