"""docs/audit.md's offline verification, run as written: the commands of its "Verifying
offline, step by step" block against a real database, then once more after a tampering,
which the same verify command must refuse (exit 2)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from gateway.database import AuditLog, Database, Signer
from tests.integration.audit_db.conftest import record

ROOT = Path(__file__).resolve().parents[3]
SECTION = "### Verifying offline, step by step"


def doc_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "audit.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index(SECTION) :], re.S)
    assert block is not None
    lines = [ln for ln in block.group(1).splitlines() if ln and not ln.startswith("#")]
    return [shlex.split(ln) for ln in lines]


def test_the_documented_commands_verify_and_refuse_a_tampered_export(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/gateway.db"
    key = Signer.generate("gateway.local/audit")
    (tmp_path / "key.pub").write_text(key.verifier.vkey + "\n")

    async def seed() -> None:
        store = await Database.connect(url, upgrade=True)
        try:
            for i in range(8):
                rec = record(i, tenant_id="team-a" if i % 2 else "team-b")
                await store.append([(rec, None)])
            assert await AuditLog(store, key).checkpoint() is not None
        finally:
            await store.close()

    asyncio.run(seed())
    env = {**os.environ, "GATEWAY_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    commands = doc_commands()
    assert len(commands) == 5
    for argv in commands:
        assert argv[0] == ".venv/bin/python"
        done = subprocess.run(
            [sys.executable, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        if "verify-export" in argv:
            assert json.loads(done.stdout)["ok"]
    assert len((tmp_path / "team-a.jsonl").read_text().splitlines()) == 4

    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    row = json.loads(lines[2])
    row["row"]["target_model"] = "another-model"
    lines[2] = json.dumps(row)
    (tmp_path / "audit.jsonl").write_text("\n".join(lines) + "\n")
    verify = next(a for a in commands if "audit.jsonl" in a and "verify-export" in a)
    done = subprocess.run(
        [sys.executable, *verify[1:]], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert json.loads(done.stdout)["first_problem"].startswith("changed: record id 3 (leaf 2")
