"""Fuzz the gateway against its own /schema/openapi.json with schemathesis.

A real server process (`python -m gateway`) on the tiny test models is fuzzed once with each
key: a tenant key, an auditor key and the admin key, every operation, every phase (examples,
coverage, fuzzing, stateful on the document's links), seeded. The checks are the contract's:
no 5xx, documented statuses, documented content types, responses that match their schemas,
and every body, query or path value the document forbids refused with a 4xx.

`make test` runs a bounded pass (test_fuzz_contract.py); `make fuzz` runs
``python -m tests.integration.service.fuzz --minutes 10`` (the time split over the two phases:
the tenant's and the auditor's keys together, then the admin's)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.integration import tiny_models
from tests.integration.service.harness import ADMIN, ADMIN_KEY
from tests.integration.service.process import start_gateway

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance,negative_data_rejection"
)
PHASES = "examples,coverage,fuzzing,stateful"
HOOKS = "tests.integration.service.fuzz_hooks"
SEED = 19
ROOT = Path(__file__).resolve().parents[3]
FAST = {  # the server's limits and pool, not the API's: the fuzzer is one busy tenant
    "default_requests_per_minute": "100000000",
    "default_tokens_per_minute": "1000000000",
    "queue_capacity": "64",
    "max_active": "1",
    "torch_threads": "1",
}


@dataclass
class Run:
    role: str
    returncode: int
    seconds: float
    output: str

    @property
    def summary(self) -> str:
        """schemathesis's failures (if any) and closing summary."""
        lines = self.output.splitlines()
        starts = [i for i, line in enumerate(lines) if "FAILURES" in line or "SUMMARY" in line]
        return "\n".join(lines[starts[0] :] if starts else lines[-25:])


def run_schemathesis(
    url: str, key: str, role: str, report: Path, *, max_examples: int | None, max_time: int | None
) -> Run:
    args = [
        str(Path(sys.executable).with_name("st")),
        "run",
        f"{url}/schema/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        "--checks",
        CHECKS,
        "--phases",
        PHASES,
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--request-timeout",
        "120",
        "--suppress-health-check",
        "all",
        "--report",
        "ndjson",
        "--report-dir",
        str(report / role),
    ]
    if max_examples is not None:
        args += ["--max-examples", str(max_examples)]
    if max_time is not None:
        args += ["--max-time", str(max_time)]
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": HOOKS,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "NO_COLOR": "1",
        "COLUMNS": "120",
    }
    start = time.perf_counter()
    (report / role).mkdir(parents=True, exist_ok=True)  # st keeps its state in the cwd
    done = subprocess.run(
        args, env=env, cwd=report / role, capture_output=True, text=True, check=False
    )
    return Run(role, done.returncode, time.perf_counter() - start, done.stdout + done.stderr)


def fuzz(work: Path, *, max_examples: int | None, max_time: int | None) -> list[Run]:
    """Start a gateway under ``work`` and fuzz it with each key: the tenant's and the
    auditor's runs side by side (neither changes what the other may do; the auditor reads
    records the tenant's requests add, which any live gateway does), then the admin's (last:
    it creates, changes and revokes what the others would read)."""
    manifest = tiny_models.build(work / "models")
    var = work / "var"
    var.mkdir()
    proc, url, tenant_key = start_gateway(manifest, var, **FAST)
    try:
        r = httpx.post(f"{url}/admin/tenants/real/keys", json={"role": "auditor"}, headers=ADMIN)
        auditor_key = r.json()["key"]

        def run(role: str, key: str) -> Run:
            return run_schemathesis(
                url, key, role, work / "reports", max_examples=max_examples, max_time=max_time
            )

        with ThreadPoolExecutor(2) as pool:  # each run is a process of its own
            readers = [
                pool.submit(run, "tenant", tenant_key),
                pool.submit(run, "auditor", auditor_key),
            ]
            runs = [f.result() for f in readers]
        return [*runs, run("admin", ADMIN_KEY)]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="Whole run, over 2 phases.")
    args = parser.parse_args()
    per_key = max(1, int(args.minutes * 60 / 2))  # tenant and auditor together, then admin
    with tempfile.TemporaryDirectory() as tmp:
        runs = fuzz(Path(tmp), max_examples=None, max_time=per_key)
        for run in runs:
            print(f"== {run.role} key: exit {run.returncode}, {run.seconds:.0f} s\n{run.summary}\n")
    return max(run.returncode for run in runs)


if __name__ == "__main__":
    raise SystemExit(main())
