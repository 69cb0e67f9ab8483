"""The offline verifier: an export, the checkpoints and the log's public keys; no database,
no gateway.

    python -m gateway.database verify-export audit.jsonl --checkpoints checkpoints.txt \\
        --public-key key.pub

Checks, in one pass:

- every checkpoint: its signature by a trusted key (a key file may list several: the keys
  before and after a rotation), its origin the key's name; an unknown key or a signature
  that does not verify is named, and no two checkpoints may sign different roots for one
  size; with ``--witness-key``, a valid cosignature by each witness named there;
- every line: the row's ``record_hash`` recomputed from its fields (a changed field), the
  leaf numbers consecutive from 0 (a deleted, duplicated or moved line), each chain's
  ``prev_hash`` links (a deleted or reordered row, even one renumbered to hide it);
- a whole-log export: the Merkle root after each checkpoint's size equals the signed root
  (a history rewritten and re-hashed end to end, which the chain alone cannot see), and no
  checkpoint covers leaves the export lacks (a truncated tail);
- a tenant export: each line's inclusion proof against the signed checkpoint it names.

The report names each problem (the first one first) and what was verified.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.database.audit import merkle
from gateway.database.audit.chain import GENESIS, link
from gateway.database.audit.leaves import KIND_FIELDS, leaf_of
from gateway.database.audit.note import (
    Checkpoint,
    NoteError,
    SignedNote,
    Verifier,
    split_notes,
    unb64,
)

MAX_PROBLEMS = 50


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    leaves: int = 0
    checkpoints: int = 0
    verified_size: int = 0
    """The largest signed size whose root the export reproduced (whole-log export)."""
    proofs_verified: int = 0
    """Inclusion proofs that verified (tenant export)."""

    def problem(self, text: str, at: int | None = None) -> None:
        """Add a problem (``at``: before those found since that position: the cause
        before its consequences)."""
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.insert(len(self.problems) if at is None else at, text)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "leaves": self.leaves,
            "checkpoints": self.checkpoints,
            "verified_size": self.verified_size,
            "proofs_verified": self.proofs_verified,
            "first_problem": self.problems[0] if self.problems else None,
            "problems": self.problems,
        }


def read_keys(text: str) -> list[Verifier]:
    """Verifier keys, one a line (blank lines and ``#`` comments skipped)."""
    lines = [ln.strip() for ln in text.splitlines()]
    return [Verifier.parse(ln) for ln in lines if ln and not ln.startswith("#")]


def _checkpoints(
    text: str, trusted: list[Verifier], witnesses: list[Verifier], report: Report
) -> dict[int, Checkpoint]:
    signed: dict[int, Checkpoint] = {}
    for n, raw in enumerate(split_notes(text), 1):
        try:
            note = SignedNote.parse(raw)
            cp = Checkpoint.parse(note.text)
            what = f"checkpoint {n} (size {cp.size})"
            key = note.open(trusted)
        except NoteError as exc:
            report.problem(f"bad checkpoint {n}: {exc}")
            continue
        if key.name != cp.origin:
            report.problem(f"{what}: origin {cp.origin!r} is not its key's name {key.name!r}")
            continue
        if not _witnessed(note, witnesses, what, report):
            continue
        other = signed.get(cp.size)
        if other is not None and other.root != cp.root:
            report.problem(f"two different roots signed for size {cp.size}: a split view")
            continue
        signed[cp.size] = cp
    report.checkpoints = len(signed)
    return signed


def _witnessed(note: SignedNote, witnesses: list[Verifier], what: str, report: Report) -> bool:
    """Every witness required has cosigned the checkpoint (a cosignature that does not
    verify is named as forged)."""
    for w in witnesses:
        try:
            if not note.signed_by(w):
                report.problem(f"{what}: not cosigned by the witness {w.name}")
                return False
        except NoteError as exc:
            report.problem(f"{what}: forged cosignature: {exc}")
            return False
    return True


class _Walk:
    """The chains and the tree, fed line by line."""

    def __init__(self, signed: dict[int, Checkpoint], report: Report) -> None:
        self.signed, self.report = signed, report
        self.tree = merkle.MemoryTree()
        self.heads: dict[str, tuple[str, int | None]] = {k: (GENESIS, None) for k in KIND_FIELDS}
        self.last_good = 0
        self.expected = 0
        self.gap: tuple[int, int, str] | None = None
        self.gap_at = 0

    def line(self, n: int, obj: dict[str, Any]) -> None:
        kind, row, leaf = obj.get("kind"), obj.get("row"), obj.get("leaf")
        if kind not in KIND_FIELDS or not isinstance(row, dict) or not isinstance(leaf, int):
            self.report.problem(f"line {n}: not a log export line (leaf, kind, row)")
            return
        where = f"{kind} id {row.get('id')} (leaf {leaf}, line {n})"
        try:
            if link(row, KIND_FIELDS[kind], row["prev_hash"]) != row.get("record_hash"):
                self.report.problem(f"changed: {where}: its fields no longer match its hash")
        except (KeyError, ValueError, TypeError) as exc:
            self.report.problem(f"malformed: {where}: {exc!r}")
            return
        if "proof" in obj:
            self._proof(where, kind, row, leaf, obj["proof"])
            return
        self._order(leaf, where)
        prev, prev_id = self.heads[kind]
        if row["prev_hash"] != prev:
            after = "the chain's start" if prev_id is None else f"{kind} id {prev_id}"
            self.report.problem(
                f"chain broken: {where} does not link to {after} "
                "(a row deleted, moved or rewritten before it)"
            )
        self.heads[kind] = (row["record_hash"], row.get("id"))
        self.tree.append(leaf_of(kind, row))
        self._at_checkpoint()

    def _order(self, leaf: int, where: str) -> None:
        """Leaf numbers must run 0, 1, 2...; a jump is a deletion unless the skipped leaf
        turns up next (a reordering)."""
        gap, self.gap = self.gap, None
        if gap is not None:
            if gap[0] <= leaf <= gap[1]:
                text = f"out of order: {where} comes after leaf {gap[1] + 1}"
                self.report.problem(text, self.gap_at)
                return
            self._missing(gap)
        if leaf > self.expected:
            self.gap = (self.expected, leaf - 1, where)
            self.gap_at = len(self.report.problems)
        elif leaf < self.expected:
            self.report.problem(f"out of order: {where} comes after leaf {self.expected - 1}")
        self.expected = max(self.expected, leaf + 1)

    def _missing(self, gap: tuple[int, int, str]) -> None:
        first, last, before = gap
        self.report.problem(
            f"missing: leaves {first}..{last} are not in the export (before {before})", self.gap_at
        )

    def _at_checkpoint(self) -> None:
        size = self.tree.size
        cp = self.signed.get(size)
        if cp is None:
            return
        if self.tree.root() == cp.root:
            self.report.verified_size = size
            self.last_good = size
            return
        self.report.problem(
            f"rewritten history: leaves {self.last_good}..{size - 1} do not produce the root "
            f"signed for size {size} at {cp.time:%Y-%m-%dT%H:%M:%SZ}"
        )

    def _proof(self, where: str, kind: str, row: dict[str, Any], leaf: int, proof: Any) -> None:
        try:
            size = int(proof["tree_size"])
            hashes = [unb64(h) for h in proof["hashes"]]
        except (KeyError, TypeError, ValueError) as exc:
            self.report.problem(f"malformed proof: {where}: {exc!r}")
            return
        cp = self.signed.get(size)
        if cp is None:
            self.report.problem(
                f"{where}: no trusted checkpoint of size {size} to prove it against"
            )
            return
        try:
            merkle.verify_inclusion(leaf_of(kind, row), leaf, size, hashes, cp.root)
        except merkle.ProofError as exc:
            self.report.problem(f"not in the log: {where}: {exc}")
            return
        self.report.proofs_verified += 1

    def finish(self, whole: bool) -> None:
        if self.gap is not None:
            self._missing(self.gap)
        if not whole:
            return
        beyond = sorted(s for s in self.signed if s > self.tree.size)
        if beyond:
            self.report.problem(
                f"truncated: the export ends after leaf {self.tree.size - 1} but a checkpoint "
                f"signed {beyond[-1]} leaves: leaves {self.tree.size}..{beyond[-1] - 1} are missing"
            )


def verify_export(
    lines: Iterable[str],
    checkpoints_text: str,
    trusted: list[Verifier],
    witnesses: list[Verifier] | None = None,
) -> dict[str, Any]:
    """Verify an export (its lines) against a checkpoints file's notes and the trusted log
    keys; ``witnesses``: cosigning keys (type 0x04) every checkpoint must carry a valid
    cosignature of. The report (``ok``, ``first_problem``, ``problems``, counts)."""
    report = Report()
    try:
        signed = _checkpoints(checkpoints_text, trusted, witnesses or [], report)
    except NoteError as exc:
        report.problem(f"checkpoints file: {exc}")
        signed = {}
    if not signed:
        report.problem("no checkpoint signed by a trusted key: nothing to verify against")
    walk = _Walk(signed, report)
    whole = False
    for n, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            report.problem(f"line {n}: not JSON")
            continue
        if not isinstance(obj, dict):
            report.problem(f"line {n}: not a log export line")
            continue
        whole = whole or "proof" not in obj
        report.leaves += 1
        walk.line(n, obj)
    walk.finish(whole)
    return report.as_dict()
