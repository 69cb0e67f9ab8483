"""Auditor CLI working on the database directly.

    python -m gateway.database [--database-url URL] export --format jsonl|csv [filters] [--output F]
    python -m gateway.database verify            # JSON report; exit 0 ok, 2 broken
    python -m gateway.database summary [filters] [--format json|csv]
    python -m gateway.database purge [--now ISO] [--actor NAME]  # delete expired payloads
    python -m gateway.database upgrade           # alembic upgrade head (production job)

The verifiable log (docs/audit.md, "Verifying offline"):

    python -m gateway.database keygen --name ORIGIN --output audit-log.key  # prints the .pub
    python -m gateway.database checkpoint --signing-key KEY   # sequence and sign now
    python -m gateway.database export-log [--tenant T] [--output audit.jsonl]
    python -m gateway.database checkpoints [--output checkpoints.txt]      # signed notes
    python -m gateway.database verify-log        # the stored log against its rows and
                                                 # checkpoints (trusts the database)
    python -m gateway.database verify-export audit.jsonl --checkpoints checkpoints.txt \
        --public-key key.pub [--witness-key witness.pub]  # offline; exit 0 ok, 2 broken

URL: ``--database-url``, else env ``GATEWAY_DATABASE_URL``, else gateway.db in env
``GATEWAY_VAR_DIR`` (as the gateway), else ``sqlite+aiosqlite:///var/gateway.db``.
Filters: --tenant, --since/--until (ISO 8601; naive means UTC), --mode, --target-model,
--target-version, --draft-model, --draft-version, --status, --decision-id. Progress goes to stderr.
A purge is recorded in the admin events (``audit.payloads_purged``, by ``--actor``, default
``cli:$USER``), even one that found nothing expired; the gateway runs the same purge on a
schedule (``GATEWAY_RETENTION_INTERVAL_S``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from gateway.database.audit.log import AuditLog
from gateway.database.audit.log_export import export_log, export_tenant
from gateway.database.audit.log_verify import verify_log
from gateway.database.audit.note import Signer, load_signer
from gateway.database.audit.queries import csv_line
from gateway.database.audit.types import RecordFilter
from gateway.database.audit.verify_export import read_keys, verify_export
from gateway.database.base import Timeouts
from gateway.database.migrate import DEFAULT_URL, upgrade_to_head_async
from gateway.database.store import Database

EXIT_BROKEN = 2
CLI_TIMEOUTS = Timeouts(statement_ms=0)
"""PostgreSQL limits of the CLI's connection: the gateway's lock limits (a purge does not
wait behind a stuck replica for ever), no statement limit (an export or a summary over years
of records may rightly run long; a purge's statements are bounded batches anyway)."""


def parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.utcoffset() is not None else value.replace(tzinfo=UTC)


def _add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", dest="tenant_id")
    p.add_argument("--since", type=parse_time, help="inclusive, ISO 8601")
    p.add_argument("--until", type=parse_time, help="exclusive, ISO 8601")
    p.add_argument("--mode", choices=["speculative", "standard"])
    p.add_argument("--target-model")
    p.add_argument("--target-version")
    p.add_argument("--draft-model")
    p.add_argument("--draft-version")
    p.add_argument("--status", type=int)
    p.add_argument("--decision-id")


def default_url(env: Mapping[str, str]) -> str:
    """The gateway's own default: GATEWAY_DATABASE_URL, else gateway.db in GATEWAY_VAR_DIR,
    else DEFAULT_URL."""
    if "GATEWAY_DATABASE_URL" in env:
        return env["GATEWAY_DATABASE_URL"]
    if "GATEWAY_VAR_DIR" in env:
        return f"sqlite+aiosqlite:///{Path(env['GATEWAY_VAR_DIR']) / 'gateway.db'}"
    return DEFAULT_URL


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gateway.database", description=__doc__)
    parser.add_argument("--database-url", default=default_url(os.environ))
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="stream records as JSON lines or CSV")
    export.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    export.add_argument("--output", "-o", help="file to write (default stdout)")
    _add_filters(export)
    sub.add_parser("verify", help="walk the hash chains")
    summary = sub.add_parser("summary", help="requests/tokens/acceptance by day and version")
    summary.add_argument("--format", choices=["json", "csv"], default="json")
    _add_filters(summary)
    purge = sub.add_parser("purge", help="delete expired prompt/completion payloads")
    purge.add_argument("--now", type=parse_time, help="purge as of this time (default now)")
    purge.add_argument(
        "--actor",
        default=f"cli:{os.environ.get('USER') or 'unknown'}",
        help="who the admin event names (default cli:$USER)",
    )
    sub.add_parser("upgrade", help="alembic upgrade head")
    _add_log_commands(sub)
    return parser


def _add_log_commands(sub: Any) -> None:
    keygen = sub.add_parser("keygen", help="new Ed25519 signing key for the log's checkpoints")
    keygen.add_argument("--name", required=True, help="the log's origin (the key's name)")
    keygen.add_argument("--output", "-o", required=True, help="the private key file (0600)")
    sign = sub.add_parser("checkpoint", help="sequence new rows and sign a checkpoint now")
    sign.add_argument("--signing-key", required=True, help="PRIVATE+KEY+... text or its file")
    log = sub.add_parser("export-log", help="the log as JSON lines (leaf order)")
    log.add_argument("--tenant", help="only this tenant's rows, each with its inclusion proof")
    log.add_argument("--output", "-o", help="file to write (default stdout)")
    sub.add_parser("verify-log", help="the stored log against its rows and checkpoints")
    cps = sub.add_parser("checkpoints", help="every signed checkpoint (with cosignatures)")
    cps.add_argument("--output", "-o", help="file to write (default stdout)")
    check = sub.add_parser("verify-export", help="verify an export offline (no database)")
    check.add_argument("export", help="the JSON lines of export-log")
    check.add_argument("--checkpoints", required=True, help="signed checkpoints file")
    check.add_argument("--public-key", required=True, help="the log's verifier key(s), one a line")
    check.add_argument(
        "--witness-key", help="witness verifier keys, one a line: each must cosign every checkpoint"
    )


def _filter(args: argparse.Namespace) -> RecordFilter:
    names = RecordFilter.__dataclass_fields__
    return RecordFilter(**{n: getattr(args, n) for n in names if hasattr(args, n)})


async def _export(store: Database, args: argparse.Namespace, out: TextIO) -> int:
    def progress(done: int) -> None:
        print(f"\rexported {done} records", end="", file=sys.stderr, flush=True)

    async for line in store.export(_filter(args), args.format, progress=progress):
        out.write(line)
    print(file=sys.stderr)
    return 0


def _verify_export(args: argparse.Namespace, out: TextIO) -> int:
    keys = read_keys(Path(args.public_key).read_text(encoding="utf-8"))
    witnesses = read_keys(Path(args.witness_key).read_text()) if args.witness_key else []
    notes = Path(args.checkpoints).read_text(encoding="utf-8")
    with open(args.export, encoding="utf-8") as fh:
        report = verify_export(fh, notes, keys, witnesses)
    out.write(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else EXIT_BROKEN


def _keygen(args: argparse.Namespace, out: TextIO) -> int:
    signer = Signer.generate(args.name)
    path = Path(args.output)
    with open(path, "x", encoding="ascii") as fh:  # never overwrite a key
        path.chmod(0o600)
        fh.write(signer.skey + "\n")
    path.with_suffix(".pub").write_text(signer.verifier.vkey + "\n", encoding="ascii")
    out.write(signer.verifier.vkey + "\n")
    return 0


async def _log_command(store: Database, args: argparse.Namespace, out: TextIO) -> int:
    if args.command == "checkpoint":
        done = await AuditLog(store, load_signer(args.signing_key)).checkpoint()
        out.write(json.dumps(None if done is None else {"id": done.id, "size": done.size}) + "\n")
        return 0
    log = AuditLog(store)
    if args.command == "verify-log":
        report = await verify_log(log)
        out.write(json.dumps(report, indent=2) + "\n")
        return 0 if report["ok"] else EXIT_BROKEN
    sink = open(args.output, "w", encoding="utf-8") if args.output else out  # noqa: SIM115
    try:
        if args.command == "checkpoints":
            notes = await log.cosigned_notes()
            sink.write(notes)
            return 0
        lines = export_tenant(log, args.tenant) if args.tenant else export_log(log)
        async for line in lines:
            sink.write(line)
        return 0
    finally:
        if sink is not out:
            sink.close()


async def run(args: argparse.Namespace, out: TextIO) -> int:
    if args.command == "verify-export":
        return _verify_export(args, out)
    if args.command == "keygen":
        return _keygen(args, out)
    if args.command == "upgrade":
        await upgrade_to_head_async(args.database_url)
        print("database at head", file=sys.stderr)
        return 0
    store = await Database.connect(args.database_url, timeouts=CLI_TIMEOUTS)
    try:
        if args.command == "export":
            if args.output:
                with open(args.output, "w", encoding="utf-8", newline="") as fh:
                    return await _export(store, args, fh)
            return await _export(store, args, out)
        if args.command == "verify":
            report = await store.verify()
            out.write(json.dumps(report, indent=2) + "\n")
            return 0 if report["ok"] else EXIT_BROKEN
        if args.command == "summary":
            rows = await store.summary(_filter(args))
            _write_rows(rows, args.format, out)
            return 0
        if args.command == "purge":
            done = await store.purge_expired(args.actor, args.now, record_empty=True)
            out.write(json.dumps({"purged": done.purged, "events": list(done.events)}) + "\n")
            return 0
        if args.command in ("checkpoint", "export-log", "checkpoints", "verify-log"):
            return await _log_command(store, args, out)
    finally:
        await store.close()
    raise AssertionError(args.command)


def _write_rows(rows: list[dict[str, Any]], fmt: str, out: TextIO) -> None:
    if fmt == "json":
        out.write(json.dumps(rows, indent=2) + "\n")
        return
    if rows:
        out.write(csv_line(list(rows[0])))
        for row in rows:
            out.write(csv_line(list(row.values())))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return asyncio.run(run(args, sys.stdout))
