"""The checkpoint sink in an object store with a retention lock (S3 Object Lock): each
signed checkpoint becomes one object, ``<prefix><tree size, 20 digits>``, put with a
retention (``COMPLIANCE`` by default: until the date passes nobody can delete or shorten
it, the account's root user included; ``GOVERNANCE``: a user with
``s3:BypassGovernanceRetention`` can) of ``GATEWAY_AUDIT_S3_RETENTION_DAYS`` from now.

Any S3-compatible store with Object Lock (AWS; MinIO, Ceph RGW through
``GATEWAY_AUDIT_S3_ENDPOINT_URL``). Credentials and region come from boto3's standard
chain (``AWS_*`` variables, ``~/.aws``, an instance or pod role); none is a gateway
setting and none is logged (botocore's own debug lines, which carry the request headers,
are capped at INFO). The credentials need ``s3:PutObject``, ``s3:PutObjectRetention``,
``s3:GetBucketObjectLockConfiguration`` and ``s3:GetObjectRetention``, and should have no
delete or bypass right.

A bucket without Object Lock protects nothing: the sink checks the bucket's lock
configuration before its first write (again at each checkpoint until it holds), and after
each write reads the object's retention back (a store that accepts the headers and ignores
them is caught too). Either failing raises :class:`StoreNotLocked`, which the checkpoint job
logs as an error and shows in its status (``unprotected: ...``); a store that is down raises
what boto3 raised (``failed: ...``, a warning). The checkpoint is signed and kept in the
database either way, and the job goes on.

boto3 is the optional ``s3`` extra: the gateway runs without it, and a bucket configured
without it stops the start (:class:`S3LockSink` raises ValueError).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from gateway.database import AuditLog
from gateway.database.audit.log_sign import Signed
from gateway.serving.checkpoints import SinkProblem

MODES = ("COMPLIANCE", "GOVERNANCE")
KEY_DIGITS = 20
"""Tree sizes are zero-padded to this many digits (any 64-bit size), so keys sort."""


class StoreNotLocked(SinkProblem):
    """The bucket has no Object Lock, or the store did not keep the retention asked for."""

    word = "unprotected"


@dataclass(frozen=True)
class S3LockOptions:
    """The ``GATEWAY_AUDIT_S3_*`` settings."""

    bucket: str
    prefix: str = "checkpoints/"
    endpoint_url: str | None = None
    retention_days: int = 365
    mode: str = "COMPLIANCE"

    def __post_init__(self) -> None:
        if self.mode.upper() not in MODES:
            got = f"got {self.mode!r}"
            raise ValueError(f"GATEWAY_AUDIT_S3_LOCK_MODE must be COMPLIANCE or GOVERNANCE, {got}")
        if self.retention_days < 1:
            raise ValueError("GATEWAY_AUDIT_S3_RETENTION_DAYS must be at least 1")
        object.__setattr__(self, "mode", self.mode.upper())

    def key(self, size: int) -> str:
        return f"{self.prefix}{size:0{KEY_DIGITS}d}"


def _client(endpoint_url: str | None) -> Any:
    try:
        import boto3
    except ImportError:
        raise ValueError(
            "GATEWAY_AUDIT_S3_BUCKET is set but boto3 is not installed: "
            "pip install 'spec-gateway[s3]' (or unset it)"
        ) from None
    from botocore.config import Config

    logging.getLogger("botocore").setLevel(logging.INFO)  # its DEBUG lines carry the headers
    # a hung store must not hold the checkpoint job (one sink after the other) for long
    config = Config(connect_timeout=10, read_timeout=30, retries={"max_attempts": 3})
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


class S3LockSink:
    """Puts each checkpoint as one object under Object Lock retention (module docstring)."""

    def __init__(self, options: S3LockOptions, client: Any = None) -> None:
        self.options = options
        self.name = f"s3://{options.bucket}/{options.prefix}"
        self.client = client if client is not None else _client(options.endpoint_url)
        self.locked = False
        """The bucket's lock configuration was seen enabled (it cannot be turned off)."""

    def check_bucket(self) -> None:
        """Raise StoreNotLocked unless the bucket has Object Lock enabled (blocking)."""
        from botocore.exceptions import ClientError

        bucket = self.options.bucket
        try:
            conf = self.client.get_object_lock_configuration(Bucket=bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code != "ObjectLockConfigurationNotFoundError":
                raise
            conf = {}
        enabled = conf.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled")
        if enabled != "Enabled":
            raise StoreNotLocked(
                f"bucket {bucket!r} has no Object Lock: its objects can be deleted or "
                "overwritten, so it protects nothing (create the bucket with Object Lock)"
            )
        self.locked = True

    def put(self, size: int, note: str) -> str:
        """Check the bucket (until it was seen locked), put the note, read its retention
        back; the object's version id (blocking)."""
        if not self.locked:
            self.check_bucket()
        opts, body = self.options, note.encode()
        key = opts.key(size)
        until = dt.datetime.now(dt.UTC) + dt.timedelta(days=opts.retention_days)
        put = self.client.put_object(
            Bucket=opts.bucket, Key=key, Body=body, ContentType="text/plain; charset=utf-8",
            ContentMD5=base64.b64encode(hashlib.md5(body).digest()).decode(),
            ObjectLockMode=opts.mode, ObjectLockRetainUntilDate=until,
        )  # fmt: skip
        version = put.get("VersionId")
        head = self.client.head_object(Bucket=opts.bucket, Key=key, **_version(version))
        kept = head.get("ObjectLockRetainUntilDate")
        if head.get("ObjectLockMode") != opts.mode or kept is None or kept < until - _SLACK:
            raise StoreNotLocked(
                f"the store took {key} but reports no {opts.mode} retention until "
                f"{until:%Y-%m-%dT%H:%M:%SZ} on it (mode {head.get('ObjectLockMode')}, until "
                f"{kept}): it ignores Object Lock, or the credentials lack "
                "s3:GetObjectRetention"
            )
        return str(version)

    async def publish(self, log: AuditLog, signed: Signed) -> str:
        await asyncio.to_thread(self.put, signed.size, signed.note)
        return "locked"


_SLACK = dt.timedelta(seconds=1)
"""A store may keep the retain-until date to the second."""


def _version(version: str | None) -> dict[str, str]:
    return {"VersionId": version} if version else {}
