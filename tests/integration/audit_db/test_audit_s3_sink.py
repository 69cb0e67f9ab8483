"""The Object Lock sink against moto's S3 in server mode (a real HTTP endpoint on a free
port, reached through boto3 as any S3-compatible store would be): checkpoints a real
gateway signs land as locked objects whose bodies verify with the log's key, extend each
other, and pass the offline verifier; the store refuses to delete a locked version, and an
overwrite leaves it in place; a bucket without Object Lock is reported, and the job goes on.

What moto 5.2.6 enforces, and AWS does too: deleting a locked version (also with
BypassGovernanceRetention under COMPLIANCE), ``DeleteObjects`` of one, a GOVERNANCE version
deleted without the bypass; a lock put into a bucket without Object Lock. What it does not:
shortening a COMPLIANCE retention (``PutObjectRetention`` with an earlier date), which AWS
refuses: the strict xfail below says so and will fail when moto starts refusing it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from gateway.database import AuditLog, Database, Signer
from gateway.database.audit import merkle
from gateway.database.audit.note import Checkpoint, SignedNote, unb64
from gateway.serving import make_s3_sink
from gateway.serving.checkpoint_s3 import S3LockOptions, S3LockSink
from gateway.serving.checkpoints import CheckpointJob, FileSink
from gateway.settings import Settings
from tests.integration.audit_db.conftest import record
from tests.integration.service.harness import ADMIN, sqlite_gateway

ROOT = Path(__file__).resolve().parents[3]
LOG_KEY = Signer.generate("gw.test/s3")
PREFIX = "gw/checkpoints/"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """boto3's standard chain, pointed at moto's fake account and nothing of this machine's."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)


def s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint)


def bucket(endpoint: str, name: str, locked: bool = True) -> str:
    s3(endpoint).create_bucket(Bucket=name, ObjectLockEnabledForBucket=locked)
    return name


def _checked(note: str) -> Checkpoint:
    signed = SignedNote.parse(note)
    signed.open([LOG_KEY.verifier])
    return Checkpoint.parse(signed.text)


def _code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


async def test_checkpoints_land_locked_and_verify_offline(
    tiny_manifest: Path, tmp_path: Path, endpoint: str
) -> None:
    name = bucket(endpoint, "audit-locked")
    async with sqlite_gateway(
        tiny_manifest, tmp_path, audit_signing_key=LOG_KEY.skey, audit_checkpoint_file="off",
        audit_checkpoint_interval_s=3600, audit_s3_bucket=name, audit_s3_prefix=PREFIX,
        audit_s3_endpoint_url=endpoint, audit_s3_retention_days=2,
    ) as gw:  # fmt: skip
        job = gw.services.checkpoints
        for _ in range(2):
            assert (await gw.chat(max_tokens=2)).status_code == 200
        first = await job.run_once()
        assert (await gw.chat(max_tokens=2)).status_code == 200
        second = await job.run_once()
        put_at = dt.datetime.now(dt.UTC)
        assert first is not None and second is not None and second.size > first.size
        sink = f"s3://{name}/{PREFIX}"
        assert job.status.sinks == {sink: "locked"}
        auditor = {"authorization": f"Bearer {gw.auditor_key}"}
        shown = (await gw.client.get("/audit/checkpoints", headers=auditor)).json()
        assert shown["signer"]["sinks"] == {sink: "locked"}  # the console's checkpoints tab

        client = s3(endpoint)
        listed = client.list_objects_v2(Bucket=name, Prefix=PREFIX)["Contents"]
        keys = [o["Key"] for o in listed]
        assert keys == [f"{PREFIX}{first.size:020d}", f"{PREFIX}{second.size:020d}"]
        notes = []
        for key, signed in zip(keys, (first, second), strict=True):
            head = client.head_object(Bucket=name, Key=key)
            assert head["ObjectLockMode"] == "COMPLIANCE"
            until = head["ObjectLockRetainUntilDate"] - put_at
            assert dt.timedelta(days=2, minutes=-5) < until <= dt.timedelta(days=2)
            body = client.get_object(Bucket=name, Key=key)["Body"].read().decode()
            assert body == signed.note
            notes.append(body)
        old, new = _checked(notes[0]), _checked(notes[1])
        assert (old.size, new.size) == (first.size, second.size)
        r = await gw.client.get(
            "/audit/proofs/consistency", params={"first": old.size, "second": new.size},
            headers=auditor,
        )  # fmt: skip
        hashes = [unb64(h) for h in r.json()["hashes"]]
        merkle.verify_consistency(old.size, new.size, old.root, new.root, hashes)
        with pytest.raises(merkle.ProofError):  # the proof binds these two roots
            merkle.verify_consistency(old.size, new.size, new.root, new.root, hashes)
        export = (await gw.client.get("/audit/log/export", headers=ADMIN)).text

    # the auditor, offline, with the notes as the bucket holds them
    (tmp_path / "audit.jsonl").write_text(export)
    (tmp_path / "key.pub").write_text(LOG_KEY.verifier.vkey + "\n")
    (tmp_path / "bucket.txt").write_text("".join(notes))  # as `cat` joins them, in key order
    report = verify_export(tmp_path, "bucket.txt")
    assert report["ok"] and report["verified_size"] == second.size, report
    forged = notes[1].replace(notes[1].split("\n")[2], "A" * 43 + "=")  # another root
    (tmp_path / "forged.txt").write_text(notes[0] + forged)
    assert not verify_export(tmp_path, "forged.txt", expect=2)["ok"]


def verify_export(where: Path, notes: str, expect: int = 0) -> dict[str, Any]:
    argv = [sys.executable, "-m", "gateway.database", "verify-export", "audit.jsonl"]
    argv += ["--checkpoints", notes, "--public-key", "key.pub"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(argv, cwd=where, env=env, capture_output=True, text=True)
    assert done.returncode == expect, (done.stdout, done.stderr)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


async def signed_log(path: Path, n: int) -> tuple[AuditLog, Database]:
    store = await Database.connect(f"sqlite+aiosqlite:///{path}", upgrade=True)
    for i in range(n):
        await store.append([(record(i, request_id=f"r-{path.stem}-{i}"), None)])
    return AuditLog(store, LOG_KEY), store


async def test_the_store_refuses_to_delete_a_locked_checkpoint(
    tmp_path: Path, endpoint: str
) -> None:
    name = bucket(endpoint, "audit-refuses")
    log, store = await signed_log(tmp_path / "a.db", 5)
    try:
        signed = await log.checkpoint()
        assert signed is not None
        options = S3LockOptions(name, PREFIX, endpoint, retention_days=1)
        sink = S3LockSink(options)
        assert await sink.publish(log, signed) == "locked"
    finally:
        await store.close()
    client, key = s3(endpoint), options.key(signed.size)
    version = client.head_object(Bucket=name, Key=key)["VersionId"]

    for bypass in (False, True):  # COMPLIANCE: no bypass either
        with pytest.raises(ClientError) as refused:
            client.delete_object(
                Bucket=name, Key=key, VersionId=version, BypassGovernanceRetention=bypass
            )
        assert _code(refused) == "AccessDenied"
    batch = client.delete_objects(
        Bucket=name, Delete={"Objects": [{"Key": key, "VersionId": version}]}
    )
    assert [e["Code"] for e in batch.get("Errors", [])] == ["AccessDenied"]
    assert not batch.get("Deleted")

    # an overwrite and a plain delete only stack a version and a delete marker on top
    forged = client.put_object(Bucket=name, Key=key, Body=b"a rewritten history")
    assert forged["VersionId"] != version
    assert client.delete_object(Bucket=name, Key=key)["DeleteMarker"]
    kept = client.get_object(Bucket=name, Key=key, VersionId=version)
    assert kept["Body"].read().decode() == signed.note
    assert kept["ObjectLockMode"] == "COMPLIANCE"


async def test_governance_mode_yields_to_the_bypass_right(tmp_path: Path, endpoint: str) -> None:
    name = bucket(endpoint, "audit-governance")
    log, store = await signed_log(tmp_path / "g.db", 3)
    try:
        signed = await log.checkpoint()
        assert signed is not None
        options = S3LockOptions(name, PREFIX, endpoint, retention_days=1, mode="governance")
        assert await S3LockSink(options).publish(log, signed) == "locked"
    finally:
        await store.close()
    client, key = s3(endpoint), options.key(signed.size)
    head = client.head_object(Bucket=name, Key=key)
    assert head["ObjectLockMode"] == "GOVERNANCE"
    with pytest.raises(ClientError) as refused:
        client.delete_object(Bucket=name, Key=key, VersionId=head["VersionId"])
    assert _code(refused) == "AccessDenied"
    client.delete_object(
        Bucket=name, Key=key, VersionId=head["VersionId"], BypassGovernanceRetention=True
    )  # what GOVERNANCE means: whoever holds s3:BypassGovernanceRetention can
    assert "Versions" not in client.list_object_versions(Bucket=name, Prefix=key)


@pytest.mark.xfail(
    strict=True, raises=AssertionError,
    reason="moto 5.2.6 lets a COMPLIANCE retention be shortened; AWS refuses (AccessDenied)",
)  # fmt: skip
async def test_a_compliance_retention_cannot_be_shortened(tmp_path: Path, endpoint: str) -> None:
    name = bucket(endpoint, "audit-shorten")
    log, store = await signed_log(tmp_path / "s.db", 2)
    try:
        signed = await log.checkpoint()
        assert signed is not None
        options = S3LockOptions(name, PREFIX, endpoint, retention_days=1)
        await S3LockSink(options).publish(log, signed)
    finally:
        await store.close()
    client, key = s3(endpoint), options.key(signed.size)
    version = client.head_object(Bucket=name, Key=key)["VersionId"]
    now = dt.datetime.now(dt.UTC)
    retention = {"Mode": "COMPLIANCE", "RetainUntilDate": now}
    try:
        client.put_object_retention(Bucket=name, Key=key, VersionId=version, Retention=retention)
    except ClientError as exc:
        assert exc.response["Error"]["Code"] == "AccessDenied"
    else:
        raise AssertionError("the store shortened a COMPLIANCE retention")


async def test_a_bucket_without_object_lock_is_reported_and_the_job_goes_on(
    tmp_path: Path, endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    plain = bucket(endpoint, "audit-unlocked", locked=False)
    log, store = await signed_log(tmp_path / "p.db", 4)
    filed = tmp_path / "checkpoints.txt"
    unlocked = S3LockSink(S3LockOptions(plain, PREFIX, endpoint))
    down = S3LockSink(S3LockOptions(plain, "down/", "http://127.0.0.1:9"))  # nothing listens
    job = CheckpointJob(log, 3600, 1000, [unlocked, down, FileSink(str(filed))])
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.checkpoints"):
            signed = await job.run_once()
            assert signed is not None  # signed and kept; the file sink still got it
            await store.append([(record(9, request_id="r-late"), None)])
            later = await job.run_once()
            assert later is not None and later.size > signed.size
    finally:
        await store.close()
    status = job.status.sinks
    assert status[unlocked.name].startswith(
        f"unprotected: bucket '{plain}' has no Object Lock: its objects can be deleted"
    )
    assert status[down.name].startswith("failed: ")
    assert filed.read_text() == signed.note + "\n" + later.note + "\n"
    assert not unlocked.locked
    assert "Contents" not in s3(endpoint).list_objects_v2(Bucket=plain)  # nothing written
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all("has no Object Lock" in r.getMessage() for r in errors)
    assert "testing" not in caplog.text  # no credential in the log lines


def test_a_bucket_without_boto3_or_with_a_wrong_mode_stops_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert make_s3_sink(Settings()) == []
    with pytest.raises(ValueError, match="LOCK_MODE must be COMPLIANCE or GOVERNANCE"):
        make_s3_sink(Settings(audit_s3_bucket="b", audit_s3_lock_mode="legal-hold"))
    with pytest.raises(ValueError, match="RETENTION_DAYS must be at least 1"):
        make_s3_sink(Settings(audit_s3_bucket="b", audit_s3_retention_days=0))
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 now raises ImportError
    missing = r"boto3 is not installed: pip install 'spec-gateway\[s3\]'"
    with pytest.raises(ValueError, match=missing):
        make_s3_sink(Settings(audit_s3_bucket="b"))


class IgnoresLocks:
    """moto's client, but its HEAD answers without the lock: what a store that accepts the
    Object Lock headers and keeps no retention would say (simulated; moto itself keeps it)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def head_object(self, **kwargs: Any) -> dict[str, Any]:
        head = dict(self.client.head_object(**kwargs))
        head.pop("ObjectLockMode", None)
        head.pop("ObjectLockRetainUntilDate", None)
        return head


async def test_a_store_that_keeps_no_retention_is_reported(tmp_path: Path, endpoint: str) -> None:
    name = bucket(endpoint, "audit-ignored")
    log, store = await signed_log(tmp_path / "i.db", 2)
    options = S3LockOptions(name, PREFIX, endpoint, retention_days=1)
    job = CheckpointJob(log, 3600, 1000, [S3LockSink(options, IgnoresLocks(s3(endpoint)))])
    try:
        assert await job.run_once() is not None
    finally:
        await store.close()
    (status,) = job.status.sinks.values()
    assert status.startswith(f"unprotected: the store took {PREFIX}")
    assert "reports no COMPLIANCE retention" in status
