"""Run every benchmarks/*.py module that defines run(out_dir, quick) -> dict.

    python -m benchmarks [--quick] [name ...]

Each result is written to benchmarks/reports/<name>.json; a module's optional
table(result) -> str is printed, otherwise its flattened scalar results.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPORTS = HERE / "reports"


def _flatten(prefix: str, value: Any, rows: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, rows)
    elif isinstance(value, int | float | str | bool) or value is None:
        rows.append((prefix, f"{value:.4g}" if isinstance(value, float) else str(value)))


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    wanted = {a for a in argv if not a.startswith("-")}
    names = sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))
    failed = 0
    for name in names:
        if wanted and name not in wanted:
            continue
        module = importlib.import_module(f"benchmarks.{name}")
        if not callable(getattr(module, "run", None)):
            continue
        print(f"== {name} ({'quick' if quick else 'full'})", flush=True)
        t0 = time.perf_counter()
        try:
            result = module.run(REPORTS, quick=quick)
        except Exception as exc:  # one broken benchmark must not hide the others
            print(f"   FAILED: {type(exc).__name__}: {exc}")
            failed += 1
            continue
        REPORTS.mkdir(parents=True, exist_ok=True)
        path = REPORTS / f"{name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
        tmp.replace(path)
        if callable(getattr(module, "table", None)):
            print(module.table(result))
        else:
            rows: list[tuple[str, str]] = []
            _flatten("", result, rows)
            width = max((len(k) for k, _ in rows), default=0)
            for k, v in rows:
                print(f"   {k:<{width}}  {v}")
        print(f"   -> {path.relative_to(HERE.parent)} ({time.perf_counter() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
