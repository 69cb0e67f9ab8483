"""What a leaf of the log is: one row of one of the three chains, as bytes.

``leaf bytes = kind || 0x0A || canonical(row)``, where ``kind`` is ``admission``,
``record`` or ``event`` and ``canonical`` is the chain's encoding of the row (chain.py,
``prev_hash`` included), so ``record_hash = SHA-256(canonical)`` and the leaf commit to the
same bytes; the kind keeps a row of one chain from passing for a row of another. The row's
payload texts are not in it (only their digests, as in the chain): purging a payload changes
no leaf, and every proof stays valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.database.audit.chain import ADMISSION_FIELDS, EVENT_FIELDS, RECORD_FIELDS, canonical
from gateway.database.audit.merkle import leaf_hash

KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "admission": ADMISSION_FIELDS,
    "record": RECORD_FIELDS,
    "event": EVENT_FIELDS,
}
"""The chains of the log, in the order a sequencing batch takes their new rows."""


def leaf_bytes(kind: str, row: Mapping[str, Any]) -> bytes:
    """The leaf of ``row`` (a stored row, or its JSON export) of chain ``kind``."""
    return kind.encode() + b"\n" + canonical(row, KIND_FIELDS[kind], row["prev_hash"])


def leaf_of(kind: str, row: Mapping[str, Any]) -> bytes:
    """RFC 9162 leaf hash of ``row``."""
    return leaf_hash(leaf_bytes(kind, row))
