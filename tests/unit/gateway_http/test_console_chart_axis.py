"""The console's charts span the window the operator chose (charts.js `lineChart`, run in
node with a stand-in for the DOM and uPlot): one bucket of data no longer spreads the time
axis over years, and a point outside the window (a clock step) still shows."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

CHARTS_JS = Path(__file__).resolve().parents[3] / "gateway/http/console_static/charts.js"
RUNNER = """
const vm = require("vm");
const fs = require("fs");
const made = [];
function h(tag, attrs, ...kids) {
  return { tag, attrs, kids, dataset: {}, clientWidth: 640, append() {} };
}
function uPlot(opts, data) { made.push({ opts, data }); }
const ctx = vm.createContext({ h, uPlot, fmt: String, Date, Math, made });
vm.runInContext(fs.readFileSync(process.argv[1], "utf8"), ctx);
const cases = JSON.parse(fs.readFileSync(0, "utf8"));
const out = cases.map((c) => {
  made.length = 0;
  const box = vm.runInContext("lineChart", ctx)(
    { append() {} }, "t", [{ label: "x", points: c.points }], { windowSeconds: c.window });
  const range = made.length ? made[0].opts.scales.x.range() : null;
  return { range, dataset: box.dataset.xRange || null, now: Date.now() / 1000 };
});
console.log(JSON.stringify(out));
"""


def _charts(cases: list[dict[str, object]]) -> list[dict[str, object]]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    done = subprocess.run(
        [node, "-e", RUNNER, str(CHARTS_JS)], input=json.dumps(cases), capture_output=True,
        text=True, check=True, timeout=60,
    )  # fmt: skip
    return list(json.loads(done.stdout))


def test_a_chart_spans_the_chosen_window_however_few_buckets_have_data() -> None:
    import time

    now = time.time()
    one, hour, early = _charts([
        {"points": [[now - 30, 3]], "window": 900},
        {"points": [[now - 30, 3], [now - 20, 4]], "window": 3600},
        {"points": [[now - 2000, 1]], "window": 900},  # older than the window
    ])  # fmt: skip
    for chart, window in ((one, 900), (hour, 3600)):
        lo, hi = chart["range"]
        assert hi - lo == pytest.approx(window, abs=2)  # not years
        assert hi == pytest.approx(chart["now"], abs=2)
        assert chart["dataset"] == f"{round(lo)},{round(hi)}"
    lo, hi = early["range"]
    assert lo <= now - 2000 and hi == pytest.approx(early["now"], abs=2)


def test_an_empty_window_says_so_and_draws_no_axis() -> None:
    (empty,) = _charts([{"points": [], "window": 900}])
    assert empty["range"] is None and empty["dataset"] is None
