"""No thread of the gateway but the inference thread opens a torch thread pool.

Why this can regress (see gateway/serving/worker.py): a second live thread that ever ran
a parallel torch op (a draft loaded with asyncio.to_thread or on the event loop, as the
gateway did before) keeps a libgomp pool of its own, and on the 2-core machine every decode
step then took about 1.6x as long. How long depends on the machine (one CI machine lost
nothing in speed, only half its CPU use), so this test checks the cause, not the time: the
real app serves every kind of request and a rollout, and afterwards every native thread
started meanwhile must have been started by the inference thread (threads inherit their
creator's OS name). The negative control spoils the app the old way and must be caught.
The time itself is a benchmark: ``python -m benchmarks inference_thread``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="reads thread names from Linux's /proc"
)


def probe(*args: str) -> subprocess.Popen[str]:
    """The probe started (a process of its own: the threads it sees are its own alone).
    With two kernel threads, as a machine of 3 cores serves by default: with one (the
    default on 2 cores) no thread, foreign or not, ever opens a pool to be seen."""
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks._inference_probe", *args],
        cwd=ROOT,
        env={**os.environ, "GATEWAY_TORCH_THREADS": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_only_the_inference_thread_opens_torch_thread_pools(tmp_path: Path) -> None:
    # the two probes run side by side: each process reads its own threads
    running = (
        probe("gateway", str(tmp_path / "ok")),
        probe("gateway", "--spoil", str(tmp_path / "spoiled")),
    )
    try:
        served, spoiled = (result(p) for p in running)
    finally:
        for p in running:
            p.kill()
            p.wait()
    assert spoiled["foreign_pools"], f"the control went unseen, the check is blind: {spoiled}"
    assert not served["foreign_pools"], f"threads besides the inference thread: {served}"
