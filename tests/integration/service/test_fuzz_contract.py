"""The gateway against its own OpenAPI document (schemathesis, bounded and seeded): with a
tenant, an auditor and the admin key, every operation and phase, no check fails. The long
run is `make fuzz`; see fuzz.py for what is run and checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.service import fuzz

CI_EXAMPLES = 10
"""Test cases per operation and phase in `make test` (about 2,000 requests per key)."""


@pytest.mark.slow
@pytest.mark.fuzz
def test_fuzz_every_operation_with_every_key(tmp_path: Path) -> None:
    runs = fuzz.fuzz(tmp_path, max_examples=CI_EXAMPLES, max_time=None)
    assert [r.role for r in runs] == ["tenant", "auditor", "admin"]
    for run in runs:
        print(f"== {run.role} key: exit {run.returncode}, {run.seconds:.0f} s\n{run.summary}")
    failed = [r for r in runs if r.returncode != 0]
    assert not failed, "\n\n".join(r.output[-12000:] for r in failed)
    for run in runs:  # a run that tested nothing would pass too
        assert "Tested: 38" in run.output and " passed" in run.output, run.output[-3000:]
