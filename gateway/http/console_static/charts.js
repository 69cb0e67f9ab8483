// Time-series charts over uPlot (vendored in vendor/, MIT). One helper: a titled line chart
// of one or more series sharing the time axis; series with different buckets are aligned.
"use strict";

const COLORS = ["#2357d9", "#d9482b", "#18794e", "#a35c00", "#7b3fb8"];

// The time axis a chart spans: the `seconds` before now, widened to any point outside them
// (a clock step between server and browser), in uPlot's seconds.
function timeRange(times, seconds) {
  const now = Date.now() / 1000;
  const from = Math.min(now - seconds, ...times);
  const to = Math.max(now, ...times);
  return [from, to];
}

// series: [{label, points: [[t, value|null], ...], color?}]
// windowSeconds: the time axis spans the window the operator chose, however few buckets
// have data (without it a single bucket spreads the axis over years).
function lineChart(container, title, series, { unit = "", percent = false, id, windowSeconds = 900 } = {}) {
  const box = h("div", { class: "chart card", id }, h("div", { class: "title" }, title));
  container.append(box);
  const times = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  // how many points each series has (the browser tests read it)
  box.dataset.series = series.map((s) => s.points.filter((p) => p[1] !== null).length).join(",");
  if (!times.length) {
    box.append(h("p", { class: "empty" }, "No traffic in this window yet."));
    return box;
  }
  const [from, to] = timeRange(times, windowSeconds);
  box.dataset.xRange = `${Math.round(from)},${Math.round(to)}`; // the browser tests read it
  const data = [times];
  for (const s of series) {
    const byT = new Map(s.points.map((p) => [p[0], p[1]]));
    data.push(times.map((t) => (byT.has(t) ? byT.get(t) : null)));
  }
  const width = Math.max(320, box.clientWidth - 32);
  const value = (u, v) => (v === null || v === undefined ? "–" : percent ? (100 * v).toFixed(1) + "%" : fmt(v) + unit);
  const opts = {
    width,
    height: 180,
    legend: { show: true },
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: true, range: () => [from, to] }, y: percent ? { range: [0, 1] } : { auto: true } },
    axes: [
      {},
      { values: (u, vals) => vals.map((v) => (percent ? Math.round(100 * v) + "%" : fmt(v, 1))), size: 56 },
    ],
    series: [
      {},
      ...series.map((s, i) => ({
        label: s.label,
        stroke: s.color || COLORS[i % COLORS.length],
        width: 2,
        spanGaps: true,
        points: { show: true, size: 5 },
        value,
      })),
    ],
  };
  new uPlot(opts, data, box);
  return box;
}

// [[t, v]] from the live series' rows for one field
function pointsOf(rows, field) {
  return rows.map((r) => [r.t, r[field] === undefined ? null : r[field]]);
}
