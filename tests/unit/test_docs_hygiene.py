"""The docs are for users and the code reads without a lab notebook: no history markers
(numbered work sessions or periods) and no CPU-model anecdotes outside the decision records
and the benchmarks page, which is where measurements by machine belong. And the docs site
builds strictly (every link and anchor resolves, every page is in the navigation)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = (
    "docs/decisions/",
    "docs/benchmarks.md",
    "benchmarks/reports/",
    "tests/unit/test_docs_hygiene.py",
)
TEXT = re.compile(
    r"\.(py|md|ya?ml|toml|cpp|jinja|js|html|css|sh|ini|cfg)$|(^|/)(Makefile|Dockerfile)$"
)
MARKERS = re.compile(
    r"\b(?:session|work period|work session) \d+\b"
    r"|\b(?:EPYC|Xeon|Ryzen|Threadripper|Zen ?[2-5]|Sapphire Rapids|Emerald Rapids|Ice Lake"
    r"|Cascade Lake|Skylake|Genoa|Milan|Turin)\b",
    re.IGNORECASE,
)


def history_markers(text: str) -> list[str]:
    return [m.group(0) for m in MARKERS.finditer(text)]


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [p for p in out.splitlines() if TEXT.search(p) and not p.startswith(ALLOWED)]


def test_the_check_finds_what_it_looks_for() -> None:
    sample = "measured on a 2-core AMD EPYC (Zen 5) in session 19; xeon too"
    assert history_markers(sample) == ["EPYC", "Zen 5", "session 19", "xeon"]
    assert history_markers("a session of 19 requests; sessions 2") == []


def test_no_history_markers_outside_the_decision_records_and_the_benchmarks_page() -> None:
    found = []
    for path in _tracked():
        file = ROOT / path
        if not file.is_file():
            continue  # deleted in the working tree
        for n, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            found += [f"{path}:{n}: {m}" for m in history_markers(line)]
    assert not found, "move these to docs/decisions/ or docs/benchmarks.md:\n" + "\n".join(found)


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
