"""Signed checkpoints in the C2SP formats: ``signed-note``, ``tlog-checkpoint`` and the
Ed25519 ``tlog-cosignature`` (witnesses), with keys in the note key formats.

A checkpoint (the note text; every line ends in a newline)::

    <origin>                      the log's name, also the signing key's name
    <tree size>                   decimal, the number of leaves
    <base64 root hash>            RFC 9162 root over those leaves (merkle.py)
    time <YYYY-MM-DDTHH:MM:SSZ>   extension line: when it was signed

then a blank line and one signature line per signer: ``— <key name> base64(key id ||
signature)``. Key id = the first 4 bytes of ``SHA-256(name || 0x0A || type || public key)``;
type 0x01 for a log's Ed25519 signature over the note text, 0x04 for a witness's
cosignature (v1) over ``"cosignature/v1\\ntime <unix seconds>\\n" || note text``, whose
signature bytes are ``key id || uint64 time || Ed25519 signature``.

Keys as text (Go's ``golang.org/x/mod/sumdb/note`` forms): a verifier key
``<name>+<key id hex>+<base64(type || public key)>`` (the ``.pub`` file an auditor keeps),
a signer key ``PRIVATE+KEY+<name>+<key id hex>+<base64(type || seed)>`` (the secret).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ED25519 = 0x01
COSIGNATURE_V1 = 0x04
DASH = "\u2014 "
_NAME = re.compile(r"[^\s+]+")
_SIZE = re.compile(r"0|[1-9][0-9]{0,19}")


class NoteError(ValueError):
    """A malformed note or key, a bad signature, or one by no trusted key."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise NoteError(f"invalid base64 {text[:20]!r}") from exc


def key_id(name: str, kind: int, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([kind]) + public).digest()[:4]


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise NoteError(f"key name {name!r} must be non-empty, without spaces or '+'")
    return name


@dataclass(frozen=True)
class Verifier:
    """A public key that checks one signer's lines."""

    name: str
    kind: int
    public: bytes

    @property
    def id(self) -> bytes:
        return key_id(self.name, self.kind, self.public)

    @property
    def vkey(self) -> str:
        return f"{self.name}+{self.id.hex()}+{b64(bytes([self.kind]) + self.public)}"

    @classmethod
    def parse(cls, vkey: str) -> Verifier:
        parts = vkey.strip().split("+", 2)
        if len(parts) != 3:
            raise NoteError("a verifier key is <name>+<key id hex>+<base64 key>")
        name, hexid, raw = _check_name(parts[0]), parts[1], unb64(parts[2])
        if len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1):
            raise NoteError("verifier key: not an Ed25519 key (type 0x01 or 0x04)")
        v = cls(name, raw[0], raw[1:])
        if v.id.hex() != hexid.lower():
            raise NoteError(f"verifier key {name}: key id {hexid} does not match the key")
        return v

    def check(self, message: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True


@dataclass(frozen=True)
class Signer:
    """An Ed25519 private key with its key name (a log's origin or a witness's name)."""

    name: str
    kind: int
    seed: bytes

    @classmethod
    def generate(cls, name: str, kind: int = ED25519) -> Signer:
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        key = Ed25519PrivateKey.generate()
        seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return cls(_check_name(name), kind, seed)

    @classmethod
    def parse(cls, skey: str) -> Signer:
        parts = skey.strip().split("+", 4)
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
            raise NoteError("a signer key is PRIVATE+KEY+<name>+<key id hex>+<base64 key>")
        raw = unb64(parts[4])
        if len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1):
            raise NoteError("signer key: not an Ed25519 key (type 0x01 or 0x04)")
        signer = cls(_check_name(parts[2]), raw[0], raw[1:])
        if signer.verifier.id.hex() != parts[3].lower():
            raise NoteError(f"signer key {parts[2]}: key id {parts[3]} does not match the key")
        return signer

    @property
    def skey(self) -> str:
        v = self.verifier
        return f"PRIVATE+KEY+{self.name}+{v.id.hex()}+{b64(bytes([self.kind]) + self.seed)}"

    @property
    def verifier(self) -> Verifier:
        pub = self._key().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return Verifier(self.name, self.kind, pub)

    def _key(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.seed)

    def sign_line(self, text: str, now: datetime | None = None) -> str:
        """The signature line of this key over note ``text``."""
        if self.kind == ED25519:
            sig = self.verifier.id + self._key().sign(text.encode())
        else:
            ts = int((now or datetime.now(UTC)).timestamp())
            sig = self.verifier.id + struct.pack(">Q", ts) + self._key().sign(_cosigned(ts, text))
        return f"{DASH}{self.name} {b64(sig)}\n"


def _cosigned(ts: int, text: str) -> bytes:
    return f"cosignature/v1\ntime {ts}\n{text}".encode()


@dataclass(frozen=True)
class Checkpoint:
    """The note text of a checkpoint."""

    origin: str
    size: int
    root: bytes
    time: datetime

    @property
    def text(self) -> str:
        stamp = self.time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{self.origin}\n{self.size}\n{b64(self.root)}\ntime {stamp}\n"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
            raise NoteError("checkpoint text: at least three non-empty lines, each ending in \\n")
        origin, size, root = lines[0], lines[1], lines[2]
        if not _SIZE.fullmatch(size):
            raise NoteError(f"checkpoint tree size {size!r} is not a decimal number")
        raw = unb64(root)
        if len(raw) != 32:
            raise NoteError("checkpoint root hash is not 32 bytes")
        when = datetime.fromtimestamp(0, UTC)
        for ext in lines[3:-1]:
            if ext.startswith("time "):
                try:
                    when = datetime.strptime(ext[5:], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                except ValueError as exc:
                    raise NoteError(f"checkpoint time {ext[5:]!r}") from exc
        return cls(_check_name(origin), int(size), raw, when)


@dataclass(frozen=True)
class SignedNote:
    """Note text and its signature lines, as written."""

    text: str
    signatures: tuple[tuple[str, bytes], ...]
    """(key name, key id || signature bytes) of each line."""

    def __str__(self) -> str:
        return self.text + "\n" + "".join(f"{DASH}{n} {b64(s)}\n" for n, s in self.signatures)

    @classmethod
    def parse(cls, note: str) -> SignedNote:
        if "\n\n" not in note or not note.endswith("\n"):
            raise NoteError("a signed note is text, a blank line, then signature lines")
        cut = note.rindex("\n\n")
        text, sig_block = note[: cut + 1], note[cut + 2 :]
        sigs = []
        for line in sig_block[:-1].split("\n"):
            if not line.startswith(DASH) or " " not in line[len(DASH) :]:
                raise NoteError(f"malformed signature line {line[:40]!r}")
            name, _, raw = line[len(DASH) :].rpartition(" ")
            sig = unb64(raw)
            if len(sig) < 5:
                raise NoteError("signature too short")
            sigs.append((name, sig))
        if not sigs:
            raise NoteError("a signed note has at least one signature")
        return cls(text, tuple(sigs))

    def with_line(self, line: str) -> SignedNote:
        """This note with one more signature line (a cosignature)."""
        extra = SignedNote.parse(self.text + "\n" + line)
        return SignedNote(self.text, self.signatures + extra.signatures)

    def signed_by(self, verifier: Verifier) -> bool:
        """True when a line of ``verifier``'s name and key id verifies; False when there is
        no such line; NoteError when there is one and it does not verify (forged)."""
        found = False
        for name, sig in self.signatures:
            if name != verifier.name or sig[:4] != verifier.id:
                continue
            found = True
            if verifier.kind == ED25519:
                ok = verifier.check(self.text.encode(), sig[4:])
            else:
                if len(sig) != 4 + 8 + 64:
                    raise NoteError(f"cosignature by {name} has the wrong length")
                (ts,) = struct.unpack(">Q", sig[4:12])
                ok = verifier.check(_cosigned(ts, self.text), sig[12:])
            if not ok:
                raise NoteError(f"signature by {name} (key {verifier.id.hex()}) does not verify")
        return found

    def open(self, trusted: list[Verifier]) -> Verifier:
        """The trusted log key that signed this note; NoteError when none did (an unknown
        key) or a signature by a trusted key's id does not verify (a forged note)."""
        for v in trusted:
            if v.kind == ED25519 and self.signed_by(v):
                return v
        names = ", ".join(f"{n} ({s[:4].hex()})" for n, s in self.signatures)
        raise NoteError(f"signed by no trusted key: {names}")


def split_notes(text: str) -> list[str]:
    """Signed notes written one after another, separated by blank lines (a checkpoints
    file): each note's text ends at the blank line before its signature lines."""
    notes: list[str] = []
    body: list[str] = []
    sigs: list[str] = []
    for line in text.split("\n"):
        if line.startswith(DASH):
            sigs.append(line)
        elif line == "":
            if sigs:
                notes.append("\n".join(body) + "\n\n" + "\n".join(sigs) + "\n")
                body, sigs = [], []
        else:
            if sigs:  # a new note began without a blank line
                notes.append("\n".join(body) + "\n\n" + "\n".join(sigs) + "\n")
                body, sigs = [], []
            body.append(line)
    if sigs:
        notes.append("\n".join(body) + "\n\n" + "\n".join(sigs) + "\n")
    elif body:
        raise NoteError("the checkpoints file ends with a note without signatures")
    return notes


def load_signer(value: str) -> Signer:
    """A signer key given as its text (``PRIVATE+KEY+...``, e.g. injected by a secrets
    manager) or as the path of a file holding it."""
    if value.strip().startswith("PRIVATE+KEY+"):
        return Signer.parse(value)
    from pathlib import Path

    return Signer.parse(Path(value).read_text(encoding="ascii"))


def generated_signer(directory: str, name: str, stem: str = "audit-log") -> tuple[Signer, bool]:
    """The signer key kept in ``directory/<stem>.key``, generated (0600, with its verifier
    key beside it in ``<stem>.pub``) when missing; True when it was generated now."""
    from pathlib import Path

    path = Path(directory) / f"{stem}.key"
    if path.exists():
        return Signer.parse(path.read_text(encoding="ascii")), False
    signer = Signer.generate(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".key.tmp")
    tmp.write_text(signer.skey + "\n", encoding="ascii")
    tmp.chmod(0o600)
    tmp.replace(path)
    (Path(directory) / f"{stem}.pub").write_text(signer.verifier.vkey + "\n", encoding="ascii")
    return signer, True
