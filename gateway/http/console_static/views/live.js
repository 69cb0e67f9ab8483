// Live traffic of one tenant: requests, mode share, acceptance, tokens/s and p95 latency in
// 5-second buckets over the last hour (the gateway's in-memory series; Prometheus keeps more).
"use strict";

Console.views.live = {
  title: "Live traffic",
  admin: true,
  async render(el, params) {
    const tenants = (await api("GET", "/admin/tenants")).data.map((t) => t.id);
    const known = (await api("GET", "/console/api/live")).tenants;
    const all = [...new Set([...tenants, ...known])].sort();
    let tenant = params.get("tenant") || all[0];
    const select = h(
      "select",
      { id: "live-tenant", onchange: (e) => (location.hash = "#/live?tenant=" + encodeURIComponent(e.target.value)) },
      all.map((t) => h("option", { value: t, selected: t === tenant }, t)),
    );
    const windowSel = h(
      "select",
      { id: "live-window", onchange: () => draw() },
      [[900, "15 minutes"], [3600, "1 hour"]].map(([s, l]) => h("option", { value: s, selected: s === 900 }, l)),
    );
    const summary = h("div", { class: "stats card", id: "live-summary" });
    const charts = h("div", { class: "grid2", id: "live-charts" });
    el.append(
      h("h1", {}, "Live traffic"),
      h("div", { class: "row card" }, h("label", {}, "Tenant", select), h("label", {}, "Window", windowSel),
        h("p", { class: "muted" }, "Every completed request, bucketed by 5 seconds; refreshes by itself.")),
      summary,
      charts,
    );
    if (!tenant) {
      charts.append(h("p", { class: "empty" }, "No tenants yet: create one under Tenants & keys."));
      return;
    }
    async function draw() {
      const rows = (await api("GET", `/console/api/live?tenant=${encodeURIComponent(tenant)}&window=${windowSel.value}`)).data;
      const total = rows.reduce((n, r) => n + r.requests, 0);
      const errors = rows.reduce((n, r) => n + r.errors, 0);
      const p95s = rows.map((r) => r.p95_ms).filter((v) => v !== null);
      const acc = rows.map((r) => r.acceptance).filter((v) => v !== null);
      summary.replaceChildren(
        stat(total, "requests"),
        stat(errors, "errors"),
        stat(acc.length ? pct(acc.reduce((a, b) => a + b, 0) / acc.length) : "–", "mean acceptance"),
        stat(p95s.length ? fmt(Math.max(...p95s), 0) + " ms" : "–", "worst bucket p95"),
      );
      charts.replaceChildren();
      lineChart(charts, "Requests per 5 s", [{ label: "requests", points: pointsOf(rows, "requests") },
        { label: "errors", points: pointsOf(rows, "errors"), color: "#c0362c" }], { id: "chart-requests", windowSeconds: Number(windowSel.value) });
      lineChart(charts, "Speculative share (mode)", [{ label: "speculative", points: pointsOf(rows, "speculative_share") }], { percent: true, id: "chart-mode", windowSeconds: Number(windowSel.value) });
      lineChart(charts, "Acceptance (accepted / drafted)", [{ label: "acceptance", points: pointsOf(rows, "acceptance") }], { percent: true, id: "chart-acceptance", windowSeconds: Number(windowSel.value) });
      lineChart(charts, "Tokens/s per request", [{ label: "tokens/s", points: pointsOf(rows, "tokens_per_s") }], { id: "chart-tps", windowSeconds: Number(windowSel.value) });
      lineChart(charts, "p95 latency", [{ label: "p95", points: pointsOf(rows, "p95_ms") }], { unit: " ms", id: "chart-p95", windowSeconds: Number(windowSel.value) });
    }
    await draw();
    every(5000, () => draw().catch(() => {}));
  },
};
