"""A witness: countersigns a log's checkpoints, each only if it is consistent with the last
one it countersigned, and remembers that one (size and root) in a file of its own.

Another gateway or an auditor runs it (``POST /witness/add-checkpoint``, gateway/http/
audit.py, when ``GATEWAY_WITNESS_KEY`` is set); the log sends every checkpoint it signs.
A database operator who rewrites history must then either show the witness a checkpoint
that does not extend the one it holds (refused, 422: it never cosigns a fork) or stop
getting cosignatures (visible on the console and in ``/audit/checkpoints``). The protocol
follows C2SP ``tlog-witness``: the request body is ::

    old <size the log believes the witness holds>
    <base64 consistency proof hash, one a line>

    <the signed checkpoint>

and the answer is the witness's cosignature line (C2SP ``tlog-cosignature``, Ed25519
v1). Refusals: 403 a log or signature it does not trust, 409 ``old`` is not the size it
holds (the body says which; the log retries from there), 422 the proof does not show the
new checkpoint extends the one it holds, 400 a malformed request.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from gateway.database.audit import merkle
from gateway.database.audit.note import (
    COSIGNATURE_V1,
    Checkpoint,
    NoteError,
    SignedNote,
    Signer,
    Verifier,
    b64,
    unb64,
)


class WitnessRefusal(Exception):
    """The witness refuses to cosign; ``status`` is the HTTP status it answers with."""

    def __init__(self, status: int, message: str, size: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.size = size
        """The size the witness holds (a 409's body)."""


@dataclass(frozen=True)
class WitnessRequest:
    old_size: int
    proof: list[bytes]
    note: str

    def body(self) -> str:
        hashes = "".join(b64(h) + "\n" for h in self.proof)
        return f"old {self.old_size}\n{hashes}\n{self.note}"

    @classmethod
    def parse(cls, body: str) -> WitnessRequest:
        head, sep, note = body.partition("\n\n")
        lines = head.split("\n")
        if not sep or not lines[0].startswith("old "):
            raise WitnessRefusal(400, "body: 'old <size>', proof lines, a blank line, the note")
        try:
            old = int(lines[0][4:])
            proof = [unb64(h) for h in lines[1:] if h]
        except (ValueError, NoteError) as exc:
            raise WitnessRefusal(400, f"malformed request: {exc}") from exc
        if old < 0 or any(len(h) != 32 for h in proof):
            raise WitnessRefusal(400, "malformed request: sizes and hashes")
        return cls(old, proof, note)


class Witness:
    """Cosigns checkpoints of the logs it trusts (their verifier keys; a log's origin is its
    key's name). State: ``{origin: {"size", "root"}}`` in ``state_path``, rewritten
    atomically (temporary file, fsync, rename) before a cosignature is returned."""

    def __init__(self, signer: Signer, logs: list[Verifier], state_path: str | Path) -> None:
        if signer.kind != COSIGNATURE_V1:
            signer = Signer(signer.name, COSIGNATURE_V1, signer.seed)
        self.signer = signer
        self.logs = {v.name: v for v in logs}
        self.path = Path(state_path)
        self._lock = threading.Lock()

    def state(self) -> dict[str, dict[str, object]]:
        if not self.path.exists():
            return {}
        data: dict[str, dict[str, object]] = json.loads(self.path.read_text(encoding="utf-8"))
        return data

    def _save(self, state: dict[str, dict[str, object]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(self.path)

    def add_checkpoint(self, request: WitnessRequest) -> str:
        """The cosignature line for ``request``'s checkpoint, or WitnessRefusal."""
        try:
            note = SignedNote.parse(request.note)
            cp = Checkpoint.parse(note.text)
        except NoteError as exc:
            raise WitnessRefusal(400, f"malformed checkpoint: {exc}") from exc
        log = self.logs.get(cp.origin)
        if log is None:
            raise WitnessRefusal(403, f"unknown log {cp.origin!r}")
        try:
            if not note.signed_by(log):
                raise WitnessRefusal(403, f"checkpoint not signed by the key of {cp.origin}")
        except NoteError as exc:
            raise WitnessRefusal(403, str(exc)) from exc
        with self._lock:
            state = self.state()
            held = state.get(cp.origin)
            size = 0 if held is None else int(str(held["size"]))
            if request.old_size != size:
                raise WitnessRefusal(409, f"the witness holds size {size}", size)
            if cp.size < size:
                raise WitnessRefusal(400, f"size {cp.size} is smaller than the held {size}")
            if held is not None:
                try:
                    root = unb64(str(held["root"]))
                    merkle.verify_consistency(size, cp.size, root, cp.root, request.proof)
                except merkle.ProofError as exc:
                    raise WitnessRefusal(
                        422, f"inconsistent with the checkpoint of size {size}: {exc}"
                    ) from exc
            state[cp.origin] = {"size": cp.size, "root": b64(cp.root)}
            self._save(state)
        return self.signer.sign_line(note.text)
