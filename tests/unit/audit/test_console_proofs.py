"""The console's in-browser inclusion check (views/audit.js, LogProof) run in node against
proofs the Python log makes: every honest proof verifies, a wrong leaf, index, hash or root
does not, and its leaf of a record hash is the Python one."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.database.audit.leaves import leaf_from_hash
from gateway.database.audit.merkle import MemoryTree, inclusion_proof
from gateway.database.audit.note import b64

AUDIT_JS = Path(__file__).resolve().parents[3] / "gateway/http/console_static/views/audit.js"
RUNNER = """
const vm = require("vm");
const fs = require("fs");
const ctx = vm.createContext({ Console: { views: {} }, atob, TextEncoder, globalThis: { crypto } });
vm.runInContext(fs.readFileSync(process.argv[1], "utf8"), ctx);
const LogProof = vm.runInContext("LogProof", ctx);
const cases = JSON.parse(fs.readFileSync(0, "utf8"));
(async () => {
  const out = [];
  for (const c of cases) {
    const leaf = await LogProof.leaf("record", c.record_hash);
    const ok = await LogProof.verifyInclusion(
      c.leaf ? LogProof.b64(c.leaf) : leaf, c.index, c.size, c.proof.map(LogProof.b64),
      LogProof.b64(c.root));
    out.push({ ok, leaf: Buffer.from(leaf).toString("base64") });
  }
  console.log(JSON.stringify(out));
})();
"""


def run_node(cases: list[dict[str, object]]) -> list[dict[str, object]]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    done = subprocess.run(
        [node, "-e", RUNNER, str(AUDIT_JS)], input=json.dumps(cases), capture_output=True,
        text=True, check=True, timeout=60,
    )  # fmt: skip
    return list(json.loads(done.stdout))


def test_the_console_verifies_honest_proofs_and_refuses_the_rest() -> None:
    hashes = [f"{i:064x}" for i in range(13)]
    tree = MemoryTree()
    for h in hashes:
        tree.append(leaf_from_hash("record", h))
    cases: list[dict[str, object]] = []
    for size in (1, 2, 7, 13):
        root = b64(tree.root(size))
        for i in range(size):
            proof = [b64(p) for p in inclusion_proof(i, size, tree.source)]
            case = {"record_hash": hashes[i], "index": i, "size": size, "proof": proof}
            cases.append({**case, "root": root})
    honest = len(cases)
    proof = [b64(p) for p in inclusion_proof(5, 13, tree.source)]
    root = b64(tree.root(13))
    cases += [
        {"record_hash": hashes[6], "index": 5, "size": 13, "proof": proof, "root": root},
        {"record_hash": hashes[5], "index": 4, "size": 13, "proof": proof, "root": root},
        {"record_hash": hashes[5], "index": 5, "size": 13, "proof": proof[:-1], "root": root},
        {"record_hash": hashes[5], "index": 5, "size": 13, "proof": proof[::-1], "root": root},
        {
            "record_hash": hashes[5],
            "index": 5,
            "size": 13,
            "proof": proof,
            "root": b64(tree.root(12)),
        },
    ]
    results = run_node(cases)
    assert [r["ok"] for r in results] == [True] * honest + [False] * 5
    assert results[0]["leaf"] == b64(leaf_from_hash("record", hashes[0]))
