"""RFC 9162 Merkle tree: roots against the RFC's recursive definition, inclusion and
consistency proofs for every leaf and size pair, and the proofs failing where they must."""

from __future__ import annotations

import hashlib
import math

import pytest

from gateway.database.audit import merkle
from gateway.database.audit.merkle import (
    MemoryTree,
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    verify_consistency,
    verify_inclusion,
)

DATA = [f"leaf {i}".encode() for i in range(40)]


def mth(d: list[bytes]) -> bytes:
    """MTH straight from RFC 9162 section 2.1.1 (the reference the tree must match)."""
    if not d:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return hashlib.sha256(b"\x00" + d[0]).digest()
    k = 1
    while k * 2 < len(d):
        k *= 2
    return hashlib.sha256(b"\x01" + mth(d[:k]) + mth(d[k:])).digest()


@pytest.fixture(scope="module")
def tree() -> MemoryTree:
    t = MemoryTree()
    for d in DATA:
        t.append(leaf_hash(d))
    return t


def test_roots_match_the_rfc_definition_at_every_size(tree: MemoryTree) -> None:
    for n in range(len(DATA) + 1):
        assert tree.root(n) == mth(DATA[:n]), n


def test_the_rfc_9162_known_answer_for_the_empty_tree() -> None:
    assert MemoryTree().root().hex() == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


def test_every_inclusion_proof_verifies_and_is_at_most_log2_n_hashes(tree: MemoryTree) -> None:
    for n in range(1, len(DATA) + 1):
        root = mth(DATA[:n])
        for i in range(n):
            proof = inclusion_proof(i, n, tree.source)
            assert len(proof) <= math.ceil(math.log2(n))
            verify_inclusion(leaf_hash(DATA[i]), i, n, proof, root)


def test_inclusion_fails_for_another_leaf_index_proof_or_root(tree: MemoryTree) -> None:
    n, i = 37, 11
    proof = inclusion_proof(i, n, tree.source)
    root = mth(DATA[:n])
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(b"not in the log"), i, n, proof, root)
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(DATA[i]), i + 1, n, proof, root)
    bad = [*proof[:-1], node_hash(proof[-1], proof[-1])]
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(DATA[i]), i, n, bad, root)
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(DATA[i]), i, n, proof[:-1], root)
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(DATA[i]), i, n, proof, mth(DATA[: n - 1]))


def test_every_consistency_proof_verifies(tree: MemoryTree) -> None:
    for n in range(1, len(DATA) + 1):
        for m in range(0, n + 1):
            proof = consistency_proof(m, n, tree.source)
            assert len(proof) <= math.ceil(math.log2(n)) + 1
            verify_consistency(m, n, mth(DATA[:m]), mth(DATA[:n]), proof)


def test_consistency_fails_after_a_rewrite_of_the_old_part(tree: MemoryTree) -> None:
    rewritten = list(DATA)
    rewritten[3] = b"rewritten"
    other = MemoryTree()
    for d in rewritten:
        other.append(leaf_hash(d))
    for m, n in ((8, 40), (5, 6), (13, 29)):
        # the rewritten log's proof, against the root signed before the rewrite
        proof = consistency_proof(m, n, other.source)
        with pytest.raises(ProofError):
            verify_consistency(m, n, mth(DATA[:m]), mth(rewritten[:n]), proof)
        # and the honest proof does not lead to the rewritten root
        with pytest.raises(ProofError):
            verify_consistency(
                m, n, mth(DATA[:m]), mth(rewritten[:n]), consistency_proof(m, n, tree.source)
            )


def test_same_size_with_two_roots_and_shrinking_are_refused() -> None:
    with pytest.raises(ProofError):
        verify_consistency(5, 5, mth(DATA[:5]), mth(DATA[1:6]), [])
    with pytest.raises(ProofError):
        verify_consistency(6, 5, mth(DATA[:6]), mth(DATA[:5]), [])


def test_range_nodes_tile_the_right_edge() -> None:
    assert merkle.range_nodes(0, 13) == [(3, 0), (2, 2), (0, 12)]
    assert merkle.frontier_nodes(0) == []
    with pytest.raises(ValueError):
        merkle.range_nodes(1, 5)
