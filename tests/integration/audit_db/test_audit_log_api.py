"""The verifiable log through the gateway: its checkpoint job signs, appends each checkpoint
to the file sink and has it cosigned by a witness that another gateway (a real process)
runs; a tenant auditor gets its records' inclusion proofs and an export that verifies
offline; a forked log signed with the same key is refused by the witness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.database import AuditLog, Database, Signer
from gateway.database.audit import merkle
from gateway.database.audit.note import COSIGNATURE_V1, Checkpoint, SignedNote, b64, unb64
from gateway.database.audit.verify_export import verify_export
from gateway.serving.checkpoints import WitnessRefused, WitnessSink
from tests.integration.audit_db.conftest import record
from tests.integration.service.harness import ADMIN, sqlite_gateway
from tests.integration.service.process import start_gateway

LOG_KEY = Signer.generate("gw.test/audit")
OTHER_LOG = Signer.generate("gw.test/other")
"""A second log the witness follows (the test of the fork has a log of its own)."""
WITNESS_KEY = Signer.generate("witness.test/w1", COSIGNATURE_V1)


@pytest.fixture(scope="module")
def witness_url(tiny_manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    var = tmp_path_factory.mktemp("witness")
    logs = f"{LOG_KEY.verifier.vkey},{OTHER_LOG.verifier.vkey}"
    proc, url, _ = start_gateway(
        tiny_manifest, var, witness_key=WITNESS_KEY.skey, witness_logs=logs,
        audit_checkpoint_interval_s="0",
    )  # fmt: skip
    yield f"{url}/witness/add-checkpoint"
    proc.terminate()
    proc.wait(30)


def _checked(note: str) -> Checkpoint:
    signed = SignedNote.parse(note)
    signed.open([LOG_KEY.verifier])
    return Checkpoint.parse(signed.text)


async def test_checkpoints_are_signed_filed_witnessed_and_proofs_verify(
    tiny_manifest: Path, tmp_path: Path, witness_url: str
) -> None:
    filed = tmp_path / "sink" / "checkpoints.txt"
    async with sqlite_gateway(
        tiny_manifest, tmp_path, audit_signing_key=LOG_KEY.skey, audit_checkpoint_file=str(filed),
        audit_witness_url=witness_url, audit_witness_vkey=WITNESS_KEY.verifier.vkey,
        audit_checkpoint_interval_s=3600,
    ) as gw:  # fmt: skip
        job = gw.services.checkpoints
        for _ in range(2):
            assert (await gw.chat(max_tokens=2)).status_code == 200
        first = await job.run_once()
        assert (await gw.chat(max_tokens=2)).status_code == 200
        second = await job.run_once()
        assert first is not None and second is not None and second.size > first.size
        sinks = {f"file:{filed}": "appended", f"witness:{witness_url}": "cosigned"}
        assert job.status.sinks == sinks
        auditor = {"authorization": f"Bearer {gw.auditor_key}"}

        r = await gw.client.get("/audit/checkpoints", headers=auditor)
        assert r.status_code == 200, r.text
        body = r.json()
        latest = body["data"][0]
        assert latest["tree_size"] == second.size and len(latest["witnesses"]) == 1
        cosigned = SignedNote.parse(latest["cosigned"])
        assert cosigned.signed_by(WITNESS_KEY.verifier)
        assert [k["vkey"] for k in body["keys"]] == [LOG_KEY.verifier.vkey]

        records = await gw.records()
        mine = records[0]["id"]
        r = await gw.client.get(f"/audit/records/{mine}/proof", headers=auditor)
        assert r.status_code == 200, r.text
        proof = r.json()
        cp = _checked(proof["checkpoint"])
        leaf = unb64(proof["leaf_hash"])
        hashes = [unb64(h) for h in proof["hashes"]]
        merkle.verify_inclusion(leaf, proof["leaf_index"], cp.size, hashes, cp.root)
        with pytest.raises(merkle.ProofError):
            merkle.verify_inclusion(leaf, proof["leaf_index"], cp.size, hashes[1:], cp.root)

        r = await gw.client.get(
            "/audit/proofs/consistency", params={"first": first.size}, headers=auditor
        )
        c = r.json()
        old, new = _checked(c["first_checkpoint"]), _checked(c["second_checkpoint"])
        merkle.verify_consistency(
            old.size, new.size, old.root, new.root, [unb64(h) for h in c["hashes"]]
        )

        r = await gw.client.get("/audit/log/export", headers=auditor)
        lines = r.text.splitlines()
        assert lines and all(json.loads(x)["row"]["tenant_id"] == gw.tenant for x in lines)
        notes = (await gw.client.get("/audit/checkpoints/notes", headers=auditor)).text
        report = verify_export(lines, notes, [LOG_KEY.verifier])
        assert report["ok"] and report["proofs_verified"] == len(lines), report
        # every checkpoint is cosigned: an auditor may require the witness
        witnessed = verify_export(lines, notes, [LOG_KEY.verifier], [WITNESS_KEY.verifier])
        assert witnessed["ok"], witnessed
        # the file sink holds the same checkpoints, outside the database, as signed (the
        # cosignature came after): required, the witness is missing from each
        assert verify_export(lines, filed.read_text(), [LOG_KEY.verifier])["ok"]
        unwitnessed = verify_export(
            lines, filed.read_text(), [LOG_KEY.verifier], [WITNESS_KEY.verifier]
        )
        assert unwitnessed["first_problem"] == (
            f"checkpoint 1 (size {first.size}): not cosigned by the witness witness.test/w1"
        )
        line = latest["witnesses"][0]["line"]
        name, sig = line.rstrip("\n").rsplit(" ", 1)
        raw = bytearray(unb64(sig))
        raw[-1] ^= 1  # one bit of the witness's signature
        forged = notes.replace(line, f"{name} {b64(bytes(raw))}\n")
        report = verify_export(lines, forged, [LOG_KEY.verifier], [WITNESS_KEY.verifier])
        assert "forged cosignature" in report["first_problem"], report
        whole = (await gw.client.get("/audit/log/export", headers=ADMIN)).text.splitlines()
        report = verify_export(whole, filed.read_text(), [LOG_KEY.verifier])
        assert report["ok"] and report["verified_size"] == second.size, report

        r = await gw.client.get("/audit/log/export", params={"tenant": "other"}, headers=auditor)
        assert r.status_code == 403
        r = await gw.client.get(f"/audit/records/{mine}/proof", headers=gw.auth)
        assert r.status_code == 403  # an inference key reads no audit data
        r = await gw.client.get("/audit/records/999999/proof", headers=ADMIN)
        assert r.status_code == 404


async def test_the_witness_refuses_a_forked_log_signed_with_the_same_key(
    tmp_path: Path, witness_url: str
) -> None:
    async def log_with(n: int, path: Path, tag: str) -> tuple[AuditLog, Database]:
        store = await Database.connect(f"sqlite+aiosqlite:///{path}", upgrade=True)
        for i in range(n):
            await store.append([(record(i, request_id=f"{tag}-{i}"), None)])
        return AuditLog(store, OTHER_LOG), store

    honest, a = await log_with(30, tmp_path / "honest.db", "h")
    fork, b = await log_with(40, tmp_path / "fork.db", "f")  # history rewritten, re-signed
    try:
        sink = WitnessSink(witness_url, WITNESS_KEY.verifier.vkey)
        signed = await honest.checkpoint()
        assert signed is not None
        assert await sink.publish(honest, signed) == "cosigned"  # the witness holds it now
        forked = await fork.checkpoint()
        assert forked is not None and forked.size > signed.size
        fresh = WitnessSink(witness_url)  # knows nothing: learns the held size from a 409
        with pytest.raises(WitnessRefused, match="inconsistent with the checkpoint of size"):
            await fresh.publish(fork, forked)
        r = httpx.post(witness_url, content="garbage")
        assert r.status_code == 400
    finally:
        await a.close()
        await b.close()
