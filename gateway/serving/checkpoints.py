"""The checkpoint job: the audit chains' new rows sequenced into the Merkle log and a
checkpoint signed, every ``GATEWAY_AUDIT_CHECKPOINT_INTERVAL_S`` seconds or as soon as
``GATEWAY_AUDIT_CHECKPOINT_RECORDS`` rows wait, on each replica (the log's lock lets one
sign at a time, and a replica that finds nothing new signs nothing). Each checkpoint this
replica signs then goes to its sinks outside the database:

- :class:`FileSink`: appended to a file (``GATEWAY_AUDIT_CHECKPOINT_FILE``), one signed
  note after another, fsynced: the ``--checkpoints`` file of the offline verifier;
- :class:`WitnessSink`: sent to a witness (``GATEWAY_AUDIT_WITNESS_URL``), whose
  cosignature is stored with the checkpoint; a witness that refuses (a checkpoint
  inconsistent with the last one it cosigned) is logged as an error and shown in
  :attr:`CheckpointJob.status`;
- :class:`~gateway.serving.checkpoint_s3.S3LockSink`: put as one object under an S3 Object
  Lock retention (``GATEWAY_AUDIT_S3_BUCKET``, the ``s3`` extra); a bucket without the
  lock is logged as an error and shown in the status.

A sink that is down costs a warning and that sink's checkpoint, never the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gateway.database import AuditLog, Database, Signer, Verifier
from gateway.database.audit.log_sign import SEQUENCE_BATCH, Signed
from gateway.database.audit.note import SignedNote, generated_signer, load_signer
from gateway.database.audit.witness import Witness, WitnessRequest

log = logging.getLogger("gateway.checkpoints")
POLL_S = 2.0
"""How often the job looks for rows waiting (a count per chain)."""
WITNESS_TIMEOUT_S = 10.0


class Sink(Protocol):
    name: str

    async def publish(self, log: AuditLog, signed: Signed) -> str:
        """Deliver one checkpoint; returns a one-word status, raises on failure."""
        ...


class FileSink:
    """Appends each signed note (then a blank line) to ``path`` and fsyncs."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.name = f"file:{path}"

    def _append(self, note: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (note + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    async def publish(self, log: AuditLog, signed: Signed) -> str:
        await asyncio.to_thread(self._append, signed.note)
        return "appended"


class SinkProblem(Exception):
    """Not an outage: the sink refused the checkpoint or cannot protect it. The job logs an
    error (not a warning) and shows ``<word>: <message>`` as the sink's status."""

    word = "failed"


class WitnessRefused(SinkProblem):
    """The witness answered 422: the checkpoint is not consistent with what it holds."""

    word = "refused"


class WitnessSink:
    """Sends each checkpoint to a witness (C2SP tlog-witness style, see
    gateway.database.audit.witness) and stores its cosignature."""

    def __init__(self, url: str, vkey: str | None = None) -> None:
        self.url = url
        self.name = f"witness:{url}"
        self.verifier = Verifier.parse(vkey) if vkey else None
        self.held: int | None = None
        """The size the witness holds, as it last said."""

    def _post(self, body: str) -> tuple[int, str]:
        req = urllib.request.Request(
            self.url, data=body.encode(), method="POST", headers={"content-type": "text/plain"}
        )
        try:
            with urllib.request.urlopen(req, timeout=WITNESS_TIMEOUT_S) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")

    async def publish(self, log: AuditLog, signed: Signed) -> str:
        for _ in range(2):  # a 409 says which size the witness holds: retry once from it
            old = self.held or 0
            proof = await log.proof_between(old, signed.size) if old else []
            body = WitnessRequest(old, proof, signed.note).body()
            status, text = await asyncio.to_thread(self._post, body)
            if status == 409:
                self.held = int(text.strip().split()[-1])
                continue
            if status == 422:
                raise WitnessRefused(text.strip())
            if status != 200:
                raise RuntimeError(f"witness answered {status}: {text.strip()[:200]}")
            line = text.strip() + "\n"
            note = SignedNote.parse(signed.note).with_line(line)
            if self.verifier is not None and not note.signed_by(self.verifier):
                raise RuntimeError("the witness's answer is not a cosignature by its key")
            self.held = signed.size
            name = line[2:].split(" ")[0]
            await log.add_cosignature(signed.id, name, line)
            return "cosigned"
        raise RuntimeError("the witness keeps answering 409 (another log writes to it?)")


@dataclass
class JobStatus:
    """What the console shows: the last checkpoint signed here and each sink's outcome."""

    last: dict[str, Any] | None = None
    error: str | None = None
    sinks: dict[str, str] = field(default_factory=dict)


class CheckpointJob:
    """Signs checkpoints in a task of its own (see the module docstring)."""

    def __init__(self, log: AuditLog, interval_s: float, records: int, sinks: list[Sink]) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0 (a disabled job is not started)")
        self.log, self.interval_s, self.records, self.sinks = log, interval_s, records, sinks
        self.status = JobStatus()
        self._task: asyncio.Task[None] | None = None
        self._last = time.monotonic()

    async def run_once(self) -> Signed | None:
        """Sequence and sign now; publish what was signed to every sink."""
        signed = await self.log.checkpoint()
        self._last = time.monotonic()
        if signed is None:
            return None
        self.status.last = {"id": signed.id, "size": signed.size, "root": signed.root.hex()}
        for sink in self.sinks:
            try:
                self.status.sinks[sink.name] = await sink.publish(self.log, signed)
            except SinkProblem as exc:
                self.status.sinks[sink.name] = f"{exc.word}: {exc}"
                log.error("checkpoint %d %s at %s: %s", signed.id, exc.word, sink.name, exc)
            except Exception as exc:  # a sink down: the checkpoint is signed and stored
                self.status.sinks[sink.name] = f"failed: {exc}"
                log.warning("checkpoint %d not delivered to %s: %s", signed.id, sink.name, exc)
        return signed

    async def _due(self) -> bool:
        waiting = await self.log.pending()
        if waiting >= self.records:
            return True
        return waiting > 0 and time.monotonic() - self._last >= self.interval_s

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="checkpoints")

    async def _loop(self) -> None:
        backlog = False
        while True:
            await asyncio.sleep(0.05 if backlog else min(POLL_S, self.interval_s))
            try:
                due, backlog = backlog or await self._due(), False
                if due:
                    signed = await self.run_once()
                    backlog = signed is not None and signed.appended >= SEQUENCE_BATCH
                    self.status.error = None
            except Exception as exc:  # the database down, or a broken chain: say so, retry
                self.status.error = str(exc)
                log.warning("checkpoint failed, retried in %ss: %s", POLL_S, exc)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


def signing_key(value: str | None, var_dir: str, origin: str) -> Signer:
    """The log's key from the setting, or the one kept (first start: generated) in
    ``var_dir``."""
    if value:
        return load_signer(value)
    signer, made = generated_signer(var_dir, origin)
    if made:
        log.warning(
            "generated the audit log's signing key in %s/audit-log.key; give auditors its "
            "public key (audit-log.pub): %s",
            var_dir,
            signer.verifier.vkey,
        )
    return signer


@dataclass(frozen=True, kw_only=True)
class CheckpointOptions:
    """The checkpoint job's settings (GATEWAY_AUDIT_CHECKPOINT_*, GATEWAY_AUDIT_SIGNING_KEY,
    GATEWAY_AUDIT_LOG_ORIGIN, GATEWAY_AUDIT_WITNESS_*)."""

    interval_s: int
    """Seconds between checkpoints; 0 disables the job."""
    records: int
    """Chain rows waiting that make a checkpoint due before its interval."""
    key: str | None
    """The log's signing key; None: the one kept in ``var_dir`` (generated on first start)."""
    origin: str
    """The origin (log name) of a key generated on first start."""
    var_dir: str
    file: str | None
    """The file sink's path; None: ``{var_dir}/audit-checkpoints.txt``; ``off``: none."""
    witness_url: str | None = None
    witness_vkey: str | None = None


def start_checkpoints(
    store: Database, options: CheckpointOptions, more: Sequence[Sink] = ()
) -> CheckpointJob | None:
    """The started job, or None when ``interval_s`` is 0 (disabled). ``more``: sinks made
    elsewhere (the S3 one), after the file and the witness."""
    if options.interval_s < 0 or options.records < 1:
        raise ValueError("GATEWAY_AUDIT_CHECKPOINT_INTERVAL_S >= 0 and _RECORDS >= 1 required")
    if options.interval_s == 0:
        return None
    sinks: list[Sink] = []
    if options.file != "off":
        sinks.append(FileSink(options.file or str(Path(options.var_dir) / "audit-checkpoints.txt")))
    if options.witness_url:
        sinks.append(WitnessSink(options.witness_url, options.witness_vkey))
    sinks.extend(more)
    signer = signing_key(options.key, options.var_dir, options.origin)
    job = CheckpointJob(AuditLog(store, signer), options.interval_s, options.records, sinks)
    job.start()
    return job


def make_witness(key: str | None, logs: str | None, var_dir: str) -> Witness | None:
    """The witness this gateway runs (``GATEWAY_WITNESS_KEY``), or None."""
    if not key:
        return None
    if not logs:
        raise ValueError("GATEWAY_WITNESS_KEY needs GATEWAY_WITNESS_LOGS (the logs it accepts)")
    text = logs if "+" in logs and not Path(logs).exists() else Path(logs).read_text()
    vkeys = [v.strip() for v in text.replace(",", "\n").splitlines() if v.strip()]
    state = Path(var_dir) / "witness-state.json"
    return Witness(load_signer(key), [Verifier.parse(v) for v in vkeys], state)
