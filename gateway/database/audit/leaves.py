"""What a leaf of the log is: one row of one of the three chains.

``leaf bytes = kind || 0x0A || record_hash``: ``kind`` is ``admission``, ``record`` or
``event``, ``record_hash`` the row's hash as its chain stores it (64 hex digits), which is
``SHA-256(canonical(row))`` over every field of the row (chain.py, ``prev_hash``
included). So a leaf commits to the row's canonical bytes through that hash, and a verifier
recomputes it from the fields exactly as it recomputes the chain; the kind keeps a row of
one chain from passing for a row of another.

Why the hash and not the canonical bytes themselves: the checkpoint job then sequences a row
by reading three columns (id, prev_hash, record_hash) and hashing 72 bytes, instead of
reading and re-encoding the whole row (which cost about half as much again as the append
itself and showed in the gateway's audit throughput); the commitment is the same under
SHA-256's collision resistance, one hash deeper.

The row's payload texts are not in it (only their digests, as in the chain): purging a
payload changes no leaf, and every proof stays valid.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.database.audit.chain import ADMISSION_FIELDS, EVENT_FIELDS, RECORD_FIELDS, link
from gateway.database.audit.merkle import leaf_hash

KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "admission": ADMISSION_FIELDS,
    "record": RECORD_FIELDS,
    "event": EVENT_FIELDS,
}
"""The chains of the log, in the order a sequencing batch takes their new rows."""


def leaf_from_hash(kind: str, record_hash: str) -> bytes:
    """RFC 9162 leaf hash of the row of chain ``kind`` whose hash is ``record_hash``."""
    return leaf_hash(f"{kind}\n{record_hash}".encode("ascii"))


def leaf_hashes(kind: str, record_hashes: Iterable[str]) -> list[bytes]:
    """:func:`leaf_from_hash` of many rows of chain ``kind`` (a sequencing batch): the same
    RFC 9162 leaf hashes, ``SHA-256(0x00 || kind || 0x0A || record_hash)``, without two
    calls and an f-string a row."""
    prefix = b"\x00" + kind.encode("ascii") + b"\n"
    sha256 = hashlib.sha256
    return [sha256(prefix + h.encode("ascii")).digest() for h in record_hashes]


def leaf_of(kind: str, row: Mapping[str, Any]) -> bytes:
    """RFC 9162 leaf hash of ``row`` (a stored row, or its JSON export), its hash
    recomputed from its fields (what a verifier does: a changed field changes the leaf)."""
    return leaf_from_hash(kind, link(row, KIND_FIELDS[kind], row["prev_hash"]))
