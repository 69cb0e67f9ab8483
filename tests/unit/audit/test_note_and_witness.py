"""Signed checkpoints (C2SP signed-note / tlog-checkpoint, Ed25519) and the witness: a
forged or unknown-key checkpoint is refused, the witness cosigns only consistent ones."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.database.audit.merkle import MemoryTree, consistency_proof, leaf_hash
from gateway.database.audit.note import (
    COSIGNATURE_V1,
    Checkpoint,
    NoteError,
    SignedNote,
    Signer,
    Verifier,
    b64,
    split_notes,
)
from gateway.database.audit.witness import Witness, WitnessRefusal, WitnessRequest

T = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def signed(signer: Signer, size: int, root: bytes) -> str:
    text = Checkpoint(signer.name, size, root, T).text
    return text + "\n" + signer.sign_line(text)


def test_checkpoint_text_is_the_c2sp_layout_and_round_trips() -> None:
    cp = Checkpoint("gw.example/audit", 20852163, bytes(range(32)), T)
    assert cp.text == (
        "gw.example/audit\n20852163\nAAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n"
        "time 2026-12-07T09:00:00Z\n"
    )
    assert Checkpoint.parse(cp.text) == cp
    for bad in ("o\n012\nAAAA\n", "o\n1\n", "o\n1\nAAECAw==\n", "o\n-1\n" + b64(bytes(32)) + "\n"):
        with pytest.raises(NoteError):
            Checkpoint.parse(bad)


def test_keys_round_trip_and_key_id_binds_name_and_key() -> None:
    s = Signer.generate("gw.example/audit")
    assert Signer.parse(s.skey) == s
    v = Verifier.parse(s.verifier.vkey)
    assert v == s.verifier
    _, hexid, key = v.vkey.split("+", 2)
    with pytest.raises(NoteError):
        Verifier.parse(f"other.example+{hexid}+{key}")  # the id names another key


def test_a_signed_note_verifies_and_a_forged_one_is_named() -> None:
    s = Signer.generate("gw.example/audit")
    note = SignedNote.parse(signed(s, 5, bytes(32)))
    assert note.open([s.verifier]) == s.verifier
    forged = str(note).replace("\n5\n", "\n6\n")  # bigger tree, same signature
    with pytest.raises(NoteError, match="does not verify"):
        SignedNote.parse(forged).open([s.verifier])


def test_a_checkpoint_under_an_unknown_key_is_refused() -> None:
    s, other = Signer.generate("gw.example/audit"), Signer.generate("gw.example/audit")
    note = SignedNote.parse(signed(other, 5, bytes(32)))
    with pytest.raises(NoteError, match="no trusted key"):
        note.open([s.verifier])


def test_a_checkpoints_file_splits_into_its_notes() -> None:
    s = Signer.generate("gw.example/audit")
    notes = [signed(s, n, bytes([n]) * 32) for n in (1, 2, 3)]
    assert split_notes("\n".join(notes)) == notes


def _tree(data: list[bytes]) -> MemoryTree:
    t = MemoryTree()
    for d in data:
        t.append(leaf_hash(d))
    return t


@pytest.fixture
def parties(tmp_path: Path) -> tuple[Signer, Signer, Witness]:
    log = Signer.generate("gw.example/audit")
    wkey = Signer.generate("witness.example/w1", COSIGNATURE_V1)
    return log, wkey, Witness(wkey, [log.verifier], tmp_path / "witness.json")


def test_witness_cosigns_consistent_checkpoints_and_refuses_a_fork(
    parties: tuple[Signer, Signer, Witness], tmp_path: Path
) -> None:
    log, wkey, witness = parties
    data = [f"r{i}".encode() for i in range(12)]
    tree = _tree(data)
    first = signed(log, 5, tree.root(5))
    line = witness.add_checkpoint(WitnessRequest(0, [], first))
    cosigned = SignedNote.parse(first).with_line(line)
    assert cosigned.signed_by(wkey.verifier)  # a cosignature over the same text
    second = signed(log, 12, tree.root(12))
    proof = consistency_proof(5, 12, tree.source)
    witness.add_checkpoint(WitnessRequest(5, proof, second))
    # history rewritten and re-hashed: a valid signature over a tree that drops r3
    fork = _tree([*data[:3], b"rewritten", *data[4:], b"r12"])
    forked = signed(log, 13, fork.root(13))
    with pytest.raises(WitnessRefusal) as refused:
        witness.add_checkpoint(WitnessRequest(12, consistency_proof(12, 13, fork.source), forked))
    assert refused.value.status == 422
    # the witness still holds the honest size, also after a restart (its state file)
    again = Witness(wkey, [log.verifier], tmp_path / "witness.json")
    assert again.state()["gw.example/audit"]["size"] == 12
    with pytest.raises(WitnessRefusal) as stale:
        again.add_checkpoint(WitnessRequest(5, proof, second))
    assert (stale.value.status, stale.value.size) == (409, 12)


def test_witness_refuses_unknown_logs_and_forged_notes(
    parties: tuple[Signer, Signer, Witness],
) -> None:
    log, _, witness = parties
    stranger = Signer.generate("gw.example/audit")
    with pytest.raises(WitnessRefusal) as unknown:
        witness.add_checkpoint(WitnessRequest(0, [], signed(stranger, 1, bytes(32))))
    assert unknown.value.status == 403
    forged = signed(log, 1, bytes(32)).replace("\n1\n", "\n2\n")
    with pytest.raises(WitnessRefusal) as bad:
        witness.add_checkpoint(WitnessRequest(0, [], forged))
    assert bad.value.status == 403


def test_witness_request_body_round_trips() -> None:
    req = WitnessRequest(7, [bytes(32), bytes([1]) * 32], "o\n1\nx\n\n— o AAAA\n")
    assert WitnessRequest.parse(req.body()) == req
    with pytest.raises(WitnessRefusal):
        WitnessRequest.parse("new 7\n\nnote")


# The example of Go's golang.org/x/mod/sumdb/note (its package documentation and
# ExampleOpen / ExampleSign): the reference the C2SP signed-note format comes from.
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_LINE = (
    "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvq"
    "fqdngotpRZb6KE6RyyBwJnAM=\n"
)


def test_go_sumdb_notes_example_verifies_and_signs_byte_for_byte() -> None:
    verifier = Verifier.parse(GO_VKEY)
    assert SignedNote.parse(GO_TEXT + "\n" + GO_LINE).open([verifier]) == verifier
    signer = Signer.parse(GO_SKEY)
    assert signer.verifier.vkey == GO_VKEY  # the key id computed as Go computes it
    assert signer.sign_line(GO_TEXT) == GO_LINE  # Ed25519 is deterministic
    tampered = GO_TEXT.replace("problem,", "problem;") + "\n" + GO_LINE
    with pytest.raises(NoteError):
        SignedNote.parse(tampered).open([verifier])
