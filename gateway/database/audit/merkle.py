"""RFC 9162 Merkle tree hashing, inclusion and consistency proofs, over stored perfect
subtrees.

Hashing (RFC 9162, section 2.1.1)::

    leaf hash   = SHA-256(0x00 || leaf bytes)
    node hash   = SHA-256(0x01 || left || right)
    MTH({})     = SHA-256("")
    MTH(D[n])   = node(MTH(D[0:k]), MTH(D[k:n]))  with k the largest power of 2 < n

A *perfect node* ``(level, index)`` is the root of the complete subtree over leaves
``[index * 2**level, (index + 1) * 2**level)``; level 0 holds the leaf hashes. Once its last
leaf is appended it never changes, so the store keeps every one of them and a proof needs at
most ~2 log2(n) of them (one query), whatever the size of the log. Any range a proof names is
a left-to-right run of perfect nodes (:func:`range_nodes`) folded from the right.

Proof generation is written against ``NodeSource`` (a function from a list of node
coordinates to their hashes), so the same code serves an in-memory tree (tests, the offline
verifier) and the database (one ``SELECT`` for every node a proof needs). Verification
follows RFC 9162 sections 2.1.3.2 and 2.1.4.2 and needs nothing but hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

Node = tuple[int, int]
"""``(level, index)`` of a perfect subtree."""
NodeSource = Callable[[Sequence[Node]], dict[Node, bytes]]
"""Returns the hash of each perfect node asked for (KeyError/LookupError when missing)."""
EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(ValueError):
    """A proof that does not verify, or that cannot be made for the sizes asked."""


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def range_nodes(start: int, end: int) -> list[Node]:
    """The perfect nodes that tile leaves ``[start, end)``, largest first; ValueError when
    the range is not one the RFC's recursion produces (a chunk would be misaligned)."""
    nodes: list[Node] = []
    pos = start
    for level in range(max(end - start, 1).bit_length(), -1, -1):
        size = 1 << level
        if (end - start) & size:
            if pos % size:
                raise ValueError(f"range [{start}, {end}) is not tiled by aligned subtrees")
            nodes.append((level, pos >> level))
            pos += size
    return nodes


def fold(hashes: Sequence[bytes]) -> bytes:
    """MTH of a range from its perfect nodes (largest first): a right fold."""
    if not hashes:
        return EMPTY_ROOT
    acc = hashes[-1]
    for h in reversed(hashes[:-1]):
        acc = node_hash(h, acc)
    return acc


def _inclusion_ranges(index: int, start: int, end: int) -> list[tuple[int, int]]:
    """PATH(m, D[n]) of RFC 9162 2.1.3.1 as the leaf ranges whose MTHs it lists."""
    if end - start <= 1:
        return []
    k = _split(end - start)
    if index - start < k:
        return [*_inclusion_ranges(index, start, start + k), (start + k, end)]
    return [*_inclusion_ranges(index, start + k, end), (start, start + k)]


def _consistency_ranges(m: int, start: int, end: int, whole: bool) -> list[tuple[int, int]]:
    """SUBPROOF(m, D[n], b) of RFC 9162 2.1.4.1 as leaf ranges."""
    n = end - start
    if m == n:
        return [] if whole else [(start, end)]
    k = _split(n)
    if m <= k:
        return [*_consistency_ranges(m, start, start + k, whole), (start + k, end)]
    return [*_consistency_ranges(m - k, start + k, end, False), (start, start + k)]


def _resolve(ranges: list[tuple[int, int]], source: NodeSource) -> list[bytes]:
    wanted = {n: None for r in ranges for n in range_nodes(*r)}
    got = source(list(wanted))
    return [fold([got[n] for n in range_nodes(*r)]) for r in ranges]


def inclusion_proof(index: int, size: int, source: NodeSource) -> list[bytes]:
    """Audit path of leaf ``index`` in the tree of ``size`` leaves."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of size {size}")
    return _resolve(_inclusion_ranges(index, 0, size), source)


def consistency_proof(first: int, second: int, source: NodeSource) -> list[bytes]:
    """Proof that the tree of ``first`` leaves is a prefix of the tree of ``second``."""
    if not 0 <= first <= second:
        raise ProofError(f"no consistency proof from size {first} to size {second}")
    if first in (0, second):
        return []
    return _resolve(_consistency_ranges(first, 0, second, True), source)


def root(size: int, source: NodeSource) -> bytes:
    """MTH of the first ``size`` leaves."""
    return _resolve([(0, size)], source)[0] if size else EMPTY_ROOT


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root_hash: bytes
) -> None:
    """RFC 9162 2.1.3.2; raises ProofError unless ``leaf`` (a leaf hash) is leaf ``index`` of
    the tree of ``size`` leaves whose root is ``root_hash``."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("inclusion proof is shorter than the tree is deep")
    if r != root_hash:
        raise ProofError(f"leaf {index} is not in the tree of size {size} with this root")


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> None:
    """RFC 9162 2.1.4.2; raises ProofError unless the tree of ``first`` leaves with root
    ``first_root`` is a prefix of the tree of ``second`` leaves with root ``second_root``."""
    if not 0 <= first <= second:
        raise ProofError(f"sizes {first} -> {second}: a log only grows")
    if first == second:
        if proof or first_root != second_root:
            raise ProofError(f"two different roots for the same size {first}")
        return
    if first == 0:
        if proof:
            raise ProofError("a proof from the empty tree must be empty")
        return
    path = list(proof)
    if first & (first - 1) == 0:  # an exact power of 2: the old root is a node of the new
        path.insert(0, first_root)
    if not path:
        raise ProofError("empty consistency proof")
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("consistency proof is too long")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("consistency proof is too short")
    if fr != first_root:
        raise ProofError(
            f"the tree of size {second} does not extend the signed tree of size {first}"
        )
    if sr != second_root:
        raise ProofError(f"consistency proof does not lead to the root of size {second}")


def new_nodes(
    size: int, leaves: Iterable[bytes], frontier: dict[Node, bytes]
) -> list[tuple[Node, bytes]]:
    """Append ``leaves`` to a tree of ``size`` leaves whose right-edge perfect nodes
    (``frontier_nodes(size)``) are given; returns every perfect node completed, leaves
    (level 0) included, level by level, each level in index order. ``frontier`` is
    updated in place (to ``frontier_nodes`` of the new size).

    A level at a time: the new nodes of level L are a run of indices from ``size >> L``;
    when that first index is odd its left sibling is the frontier's node of level L, and
    the run (with it) is hashed in pairs into the next level's run; an unpaired last node
    stays on the frontier."""
    run = list(leaves)
    out: list[tuple[Node, bytes]] = [((0, size + i), h) for i, h in enumerate(run)]
    level, start = 0, size
    while run:
        if start & 1:
            run.insert(0, frontier.pop((level, start - 1)))
            start -= 1
        end = start + len(run)
        if len(run) & 1:
            frontier[(level, end - 1)] = run.pop()
        run = [node_hash(run[i], run[i + 1]) for i in range(0, len(run), 2)]
        level, start = level + 1, start >> 1
        out.extend(((level, start + i), h) for i, h in enumerate(run))
    return out


def frontier_nodes(size: int) -> list[Node]:
    """The perfect nodes on the right edge of a tree of ``size`` leaves (one per set bit)."""
    return range_nodes(0, size) if size else []


class MemoryTree:
    """A whole tree in memory: every perfect node, appended leaf by leaf. The offline
    verifier's and the tests' tree; the store keeps the same nodes in a table."""

    def __init__(self) -> None:
        self.nodes: dict[Node, bytes] = {}
        self.size = 0
        self._frontier: dict[Node, bytes] = {}

    def append(self, leaf: bytes) -> None:
        """Append one leaf hash."""
        for node, h in new_nodes(self.size, [leaf], self._frontier):
            self.nodes[node] = h
        self.size += 1

    def source(self, wanted: Sequence[Node]) -> dict[Node, bytes]:
        return {n: self.nodes[n] for n in wanted}

    def root(self, size: int | None = None) -> bytes:
        return root(self.size if size is None else size, self.source)
