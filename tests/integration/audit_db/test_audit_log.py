"""The verifiable log on a real SQLite file, end to end through the CLI an auditor runs:
``export-log``, ``checkpoints``, then ``verify-export`` with no database. A clean export
verifies; each tampering is detected and named, including the rewritten and re-hashed
history that ``verify`` (the chain checked against itself) still calls ok."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gateway.database import AdminEvent, AuditLog, Database, LogBroken, Payload, Signer
from gateway.database.audit import merkle
from gateway.database.audit.chain import RECORD_FIELDS, link
from gateway.database.audit.note import Checkpoint, SignedNote, b64, split_notes, unb64
from gateway.database.cli import EXIT_BROKEN, main
from tests.integration.audit_db.conftest import T0, record

T = TypeVar("T")
ORIGIN = "gw.test/audit"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Log:
    """A SQLite gateway database with a signed log, and the auditor's files."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.path = tmp / "gw.db"
        self.url = f"sqlite+aiosqlite:///{self.path}"
        self.key = Signer.generate(ORIGIN)
        (tmp / "key.pub").write_text(self.key.verifier.vkey + "\n")

    async def write(self, n: int, start: int = 0, tenant: str = "acme", **kw: Any) -> None:
        store = await Database.connect(self.url, upgrade=True)
        try:
            for i in range(start, start + n):
                rec = record(i, tenant_id=tenant if i % 3 else "beta", **kw)
                pay = Payload(f"prompt {i}", f"completion {i}", 1) if i % 2 else None
                await store.append([(rec, pay)])
        finally:
            await store.close()

    async def checkpoint(self, signer: Signer | None = None) -> Any:
        store = await Database.connect(self.url)
        try:
            return await AuditLog(store, signer or self.key).checkpoint()
        finally:
            await store.close()

    def cli(self, *args: str) -> int:
        return main(["--database-url", self.url, *args])

    def export(self, *extra: str) -> tuple[Path, Path]:
        out, cps = self.tmp / "audit.jsonl", self.tmp / "checkpoints.txt"
        assert self.cli("export-log", "--output", str(out), *extra) == 0
        assert self.cli("checkpoints", "--output", str(cps)) == 0
        return out, cps

    def verify(self, export: Path, cps: Path, key: str = "key.pub") -> dict[str, Any]:
        code = main(["verify-export", str(export), "--checkpoints", str(cps),
                     "--public-key", str(self.tmp / key)])  # fmt: skip
        report = json.loads(self.out.readouterr().out)
        assert (code == 0) == report["ok"] and code in (0, EXIT_BROKEN)
        return dict(report)

    out: pytest.CaptureFixture[str]


@pytest.fixture
def log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Log:
    lg = Log(tmp_path)
    lg.out = capsys
    run(lg.write(6))
    assert run(lg.checkpoint()).size == 7  # 6 records + the key's admin event
    run(lg.write(5, start=6))
    assert run(lg.checkpoint()).size == 12
    capsys.readouterr()
    return lg


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def rewrite(path: Path, objs: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))


def test_a_clean_export_verifies(log: Log) -> None:
    export, cps = log.export()
    report = log.verify(export, cps)
    assert report["ok"], report
    assert (report["leaves"], report["checkpoints"], report["verified_size"]) == (12, 2, 12)


def test_a_changed_field_is_named(log: Log) -> None:
    export, cps = log.export()
    objs = lines(export)
    objs[3]["row"]["status"] = 500
    rewrite(export, objs)
    report = log.verify(export, cps)
    assert report["first_problem"].startswith("changed: record id 4 (leaf 3")


def test_a_deleted_record_in_the_middle_is_named(log: Log) -> None:
    export, cps = log.export()
    objs = lines(export)
    del objs[4]
    rewrite(export, objs)
    report = log.verify(export, cps)
    assert report["first_problem"].startswith("missing: leaves 4..4")
    assert any(p.startswith("chain broken: record id 6") for p in report["problems"])


def test_a_deleted_record_renumbered_to_hide_the_gap_is_named(log: Log) -> None:
    export, cps = log.export()
    objs = lines(export)
    del objs[4]
    for i, o in enumerate(objs):
        o["leaf"] = i
    rewrite(export, objs)
    report = log.verify(export, cps)
    assert report["first_problem"].startswith("chain broken: record id 6 (leaf 4")


def test_a_truncated_tail_after_a_checkpoint_is_named(log: Log) -> None:
    export, cps = log.export()
    rewrite(export, lines(export)[:9])
    report = log.verify(export, cps)
    assert report["first_problem"] == (
        "truncated: the export ends after leaf 8 but a checkpoint signed 12 leaves: "
        "leaves 9..11 are missing"
    )
    assert report["verified_size"] == 7  # what is there still verifies


def test_reordered_records_are_named(log: Log) -> None:
    export, cps = log.export()
    objs = lines(export)
    objs[2], objs[3] = objs[3], objs[2]
    rewrite(export, objs)
    report = log.verify(export, cps)
    assert report["first_problem"].startswith("out of order: record id 3 (leaf 2, line 4)")


def _rehash_history(db: Path, record_id: int) -> None:
    """The attack that passes today: triggers dropped, one record rewritten, every later
    link of its chain recomputed (and the payload digests kept), as a DBA could."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    con.execute("DROP TRIGGER audit_records_no_update")
    con.execute("UPDATE audit_records SET status = 403 WHERE id = ?", (record_id,))
    prev = con.execute(
        "SELECT record_hash FROM audit_records WHERE id = ?", (record_id - 1,)
    ).fetchone()[0]
    for row in con.execute("SELECT * FROM audit_records WHERE id >= ? ORDER BY id", (record_id,)):
        values = dict(row)
        values["created_at"] = T0 + timedelta(minutes=values["id"] - 1)
        values["reason_codes"] = json.loads(values["reason_codes"])
        values["tool_names"] = json.loads(values["tool_names"] or "null")
        new = link(values, RECORD_FIELDS, prev)
        con.execute(
            "UPDATE audit_records SET prev_hash = ?, record_hash = ? WHERE id = ?",
            (prev, new, values["id"]),
        )
        prev = new
    con.commit()
    con.close()


def test_a_rewritten_and_rehashed_history_is_named_though_verify_says_ok(log: Log) -> None:
    _rehash_history(log.path, 3)

    async def chain_check() -> dict[str, Any]:
        store = await Database.connect(log.url)
        try:
            return await store.verify()
        finally:
            await store.close()

    assert run(chain_check())["ok"]  # the negative control: the chain alone cannot tell
    export, cps = log.export()
    report = log.verify(export, cps)
    assert not report["ok"]
    assert report["first_problem"].startswith(
        "rewritten history: leaves 0..6 do not produce the root signed for size 7"
    )


def test_a_forged_checkpoint_is_named(log: Log) -> None:
    export, cps = log.export()
    notes = cps.read_text()
    honest = Checkpoint.parse(SignedNote.parse(split_notes(notes)[0]).text)
    cps.write_text(notes.replace(b64(honest.root), b64(bytes(32)), 1))
    report = log.verify(export, cps)
    assert report["first_problem"].startswith("bad checkpoint 1: signature by gw.test/audit")
    assert "does not verify" in report["first_problem"]


def test_a_checkpoint_under_an_unknown_key_is_named(log: Log) -> None:
    export, cps = log.export()
    (log.tmp / "other.pub").write_text(Signer.generate(ORIGIN).verifier.vkey + "\n")
    report = log.verify(export, cps, key="other.pub")
    assert report["first_problem"].startswith("bad checkpoint 1: signed by no trusted key")


def test_a_tenants_proofs_verify_and_a_record_not_in_the_log_fails(log: Log) -> None:
    export, cps = log.export("--tenant", "acme")
    objs = lines(export)
    assert {o["row"]["tenant_id"] for o in objs} == {"acme"} and len(objs) == 7
    report = log.verify(export, cps)
    assert report["ok"] and report["proofs_verified"] == 7, report
    forged = objs[0]
    forged["row"]["completion_tokens"] = 1  # a record the log never held, hashed anew
    row = forged["row"]
    row["record_hash"] = link(row, RECORD_FIELDS, row["prev_hash"])
    rewrite(export, [forged])
    report = log.verify(export, cps)
    assert report["first_problem"].startswith("not in the log: record id 2 (leaf 1")


def test_consistency_between_consecutive_and_distant_checkpoints(log: Log) -> None:
    run(log.write(9, start=11))
    assert run(log.checkpoint()).size == 21

    async def proofs() -> list[dict[str, Any]]:
        store = await Database.connect(log.url)
        try:
            lg = AuditLog(store)
            return [await lg.consistency(7, 12), await lg.consistency(12), await lg.consistency(7)]
        finally:
            await store.close()

    for p in run(proofs()):
        old = Checkpoint.parse(SignedNote.parse(p["first_checkpoint"]).text)
        new = Checkpoint.parse(SignedNote.parse(p["second_checkpoint"]).text)
        hashes = [unb64(h) for h in p["hashes"]]
        merkle.verify_consistency(old.size, new.size, old.root, new.root, hashes)
        # a history rewritten before the old checkpoint: the new root does not extend it
        rewritten = merkle.MemoryTree()
        for i in range(new.size):
            rewritten.append(merkle.leaf_hash(b"rewritten %d" % i))
        forged = merkle.consistency_proof(old.size, new.size, rewritten.source)
        with pytest.raises(merkle.ProofError):
            merkle.verify_consistency(old.size, new.size, old.root, rewritten.root(), forged)


def test_proofs_still_verify_after_a_payload_purge(log: Log) -> None:
    before, _ = log.export("--tenant", "acme")
    kept = before.read_text()
    assert log.cli("purge", "--now", "2099-01-01T00:00:00Z", "--actor", "dpo") == 0
    log.out.readouterr()
    assert run(log.checkpoint()).size == 13  # the purge's admin event joins the log
    export, cps = log.export("--tenant", "acme")
    report = log.verify(export, cps)
    assert report["ok"] and report["proofs_verified"] == 7
    assert [o["leaf"] for o in lines(export)] == [json.loads(x)["leaf"] for x in kept.splitlines()]
    whole, cps = log.export()
    assert log.verify(whole, cps)["ok"]
    with sqlite3.connect(log.path) as con:
        assert con.execute("SELECT count(*) FROM audit_payloads").fetchone()[0] == 0


def test_a_key_rotation_is_an_admin_event_and_old_checkpoints_stay_verifiable(log: Log) -> None:
    new_key = Signer.generate(ORIGIN)
    run(log.write(2, start=11))
    rotated = run(log.checkpoint(new_key))
    assert rotated.size == 15  # 2 records + the rotation's event, signed by the new key

    async def events() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        store = await Database.connect(log.url)
        try:
            rows, _ = await store.events(action="audit.signing_key_rotated")
            return rows, await AuditLog(store).keys()
        finally:
            await store.close()

    rows, keys = run(events())
    assert [r["after"]["vkey"] for r in rows] == [new_key.verifier.vkey]
    assert rows[0]["before"]["vkey"] == log.key.verifier.vkey
    assert [k["vkey"] for k in keys] == [log.key.verifier.vkey, new_key.verifier.vkey]
    export, cps = log.export()
    assert lines(export)[-1]["row"]["action"] == "audit.signing_key_rotated"
    (log.tmp / "both.pub").write_text(log.key.verifier.vkey + "\n" + new_key.verifier.vkey + "\n")
    report = log.verify(export, cps, key="both.pub")
    assert report["ok"] and report["checkpoints"] == 3, report
    old_only = log.verify(export, cps)
    assert old_only["first_problem"].startswith("bad checkpoint 3: signed by no trusted key")


def test_a_chain_relinked_before_sequencing_is_never_signed_over(log: Log) -> None:
    run(log.write(2, start=11))
    con = sqlite3.connect(log.path)
    con.execute("DROP TRIGGER audit_records_no_update")
    con.execute("UPDATE audit_records SET record_hash = ? WHERE id = 12", ("f" * 64,))
    con.commit()
    con.close()
    with pytest.raises(LogBroken, match="audit_records row 13 does not link"):
        run(log.checkpoint())


def test_a_field_changed_before_sequencing_is_named_by_the_verifier(log: Log) -> None:
    run(log.write(1, start=11))
    con = sqlite3.connect(log.path)
    con.execute("DROP TRIGGER audit_records_no_update")
    con.execute("UPDATE audit_records SET status = 201 WHERE id = 12")
    con.commit()
    con.close()
    assert run(log.checkpoint()).size == 13  # the leaf holds the hash the row was written with
    export, cps = log.export()
    report = log.verify(export, cps)
    assert report["first_problem"].startswith("changed: record id 12 (leaf 12")


def test_nothing_new_signs_nothing_and_admin_events_are_leaves(log: Log) -> None:
    assert run(log.checkpoint()) is None

    async def admin() -> None:
        store = await Database.connect(log.url)
        try:
            await store.append_admin(AdminEvent("alice", "tenant.created", "t1"))
        finally:
            await store.close()

    run(admin())
    assert run(log.checkpoint()).size == 13


def _verify_log(log: Log) -> dict[str, Any]:
    code = log.cli("verify-log")
    report = json.loads(log.out.readouterr().out)
    assert (code == 0) == report["ok"]
    return dict(report)


def test_verify_log_holds_the_database_to_what_was_signed(log: Log) -> None:
    clean = _verify_log(log)
    assert clean["ok"] and clean["leaves"] == 12 and clean["checkpoints"]["checked"] == 2
    _rehash_history(log.path, 3)  # the attack verify calls ok
    report = _verify_log(log)
    assert report["first_mismatch"] == {
        "leaf": 2, "kind": "record", "id": 3,
        "problem": "the row was re-hashed after it was sequenced",
    }  # fmt: skip
    assert report["checkpoints"]["first_bad"] is None  # the stored tree itself is intact


def test_verify_log_names_a_stored_tree_that_no_longer_has_the_signed_root(log: Log) -> None:
    con = sqlite3.connect(log.path)
    con.execute("DROP TRIGGER audit_log_leaves_no_update")
    con.execute("UPDATE audit_log_leaves SET hash = ? WHERE idx = 8", (bytes(32),))
    con.commit()
    con.close()
    report = _verify_log(log)
    assert report["first_mismatch"]["leaf"] == 8
    assert report["checkpoints"]["first_bad"] == {
        "id": 2, "size": 12, "problem": "the stored tree no longer has the signed root",
    }  # fmt: skip


def test_a_stored_tree_that_no_longer_extends_the_last_checkpoint_is_never_signed(
    log: Log,
) -> None:
    con = sqlite3.connect(log.path)
    con.execute("DROP TRIGGER audit_log_nodes_no_update")
    con.execute("UPDATE audit_log_nodes SET hash = ? WHERE level = 3 AND idx = 0", (bytes(32),))
    con.commit()
    con.close()
    run(log.write(1, start=11))
    with pytest.raises(LogBroken, match="does not extend checkpoint 2"):
        run(log.checkpoint())
