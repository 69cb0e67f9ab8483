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


# The known answers of Certificate Transparency's Merkle tree tests (the RFC 6962 / 9162
# reference data that transparency-dev/merkle and certificate-transparency-go test with).
CT_LEAVES = ["", "00", "10", "2021", "3031", "40414243", "5051525354555657",
             "606162636465666768696a6b6c6d6e6f"]  # fmt: skip
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
CT_PATH_0_OF_8 = [
    "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
    "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
    "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
]
CT_CONSISTENCY_6_TO_8 = [
    "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
    "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
]


def test_certificate_transparency_known_answers() -> None:
    t = MemoryTree()
    for i, leaf in enumerate(CT_LEAVES):
        t.append(leaf_hash(bytes.fromhex(leaf)))
        assert t.root().hex() == CT_ROOTS[i], i + 1
    assert [h.hex() for h in inclusion_proof(0, 8, t.source)] == CT_PATH_0_OF_8
    assert [h.hex() for h in consistency_proof(1, 8, t.source)] == CT_PATH_0_OF_8
    assert [h.hex() for h in consistency_proof(6, 8, t.source)] == CT_CONSISTENCY_6_TO_8
    six, eight = bytes.fromhex(CT_ROOTS[5]), bytes.fromhex(CT_ROOTS[7])
    verify_consistency(6, 8, six, eight, [bytes.fromhex(h) for h in CT_CONSISTENCY_6_TO_8])


def _completed(size: int, count: int) -> dict[merkle.Node, bytes]:
    """Every perfect node whose last leaf is among leaves [size, size + count), from the
    RFC's definition (the reference a batch append must produce)."""
    out = {}
    for level in range((size + count).bit_length()):
        width = 1 << level
        for idx in range(size // width, (size + count) // width):
            if (idx + 1) * width > size:
                out[(level, idx)] = mth(DATA[idx * width : (idx + 1) * width])
    return out


def test_a_batch_append_completes_exactly_the_rfc_nodes_from_every_size() -> None:
    """new_nodes over a batch (the checkpoint job appends thousands at once, a level at a
    time) gives the nodes and frontier the RFC gives, for every start size and length."""
    hashes = [leaf_hash(d) for d in DATA]
    for size in range(len(DATA)):
        for count in range(1, len(DATA) - size + 1):
            frontier = {n: mth(DATA[n[1] << n[0] : (n[1] + 1) << n[0]])
                        for n in merkle.frontier_nodes(size)}  # fmt: skip
            got = merkle.new_nodes(size, hashes[size : size + count], frontier)
            assert dict(got) == _completed(size, count), (size, count)
            assert len(got) == len(dict(got))
            assert frontier == {n: mth(DATA[n[1] << n[0] : (n[1] + 1) << n[0]])
                                for n in merkle.frontier_nodes(size + count)}  # fmt: skip
    # negative control: the same batch appended after the wrong size (its frontier taken
    # for size 5, its nodes placed as if at 6) is told apart from the RFC's nodes
    frontier = {n: mth(DATA[n[1] << n[0] : (n[1] + 1) << n[0]]) for n in merkle.frontier_nodes(5)}
    with pytest.raises(KeyError):
        merkle.new_nodes(7, hashes[7:9], frontier)
    frontier = {n: mth(DATA[n[1] << n[0] : (n[1] + 1) << n[0]]) for n in merkle.frontier_nodes(6)}
    assert dict(merkle.new_nodes(6, hashes[7:9], frontier)) != _completed(6, 2)
