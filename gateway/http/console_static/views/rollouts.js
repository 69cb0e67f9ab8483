// Draft rollouts: start a canary, watch canary against baseline (acceptance, tokens/s, p95
// over time from the live series, and the guard's running totals), then promote (the
// regression gate runs first), pause, resume or roll back, each after a confirmation.
"use strict";

const ACTIONS = {
  canary: ["promote", "pause", "rollback"],
  paused: ["resume", "promote", "rollback"],
  promoted: [],
  rolled_back: [],
};

Console.views.rollouts = {
  title: "Rollouts",
  admin: true,
  async render(el, params) {
    const models = (await api("GET", "/admin/models")).data;
    const targets = models.filter((m) => m.role === "target");
    const drafts = models.filter((m) => m.role === "draft");
    const gate = h("div", { id: "gate" });
    const list = h("div", { class: "card", id: "rollout-list" });
    const detail = h("div", { id: "rollout-detail" });
    el.append(h("h1", {}, "Rollouts"), startForm(targets, drafts), gate, list, detail);
    let selected = params.get("id");

    async function act(r, action) {
      const what = { promote: "Promote (runs the regression gate first)", pause: "Pause", resume: "Resume", rollback: "Roll back" }[action];
      if (!confirm(`${what} rollout ${r.id}: ${r.draft}@${r.version} on ${r.target}?`)) return;
      try {
        const out = await api("POST", `/admin/rollouts/${encodeURIComponent(r.id)}/${action}`);
        toast(`Rollout ${r.id}: ${out.state}`);
        if (out.gate) showGate(gate, out.gate);
      } catch (e) {
        toast(e.message, true);
        if (action === "promote") gate.replaceChildren(h("div", { class: "card error", id: "gate-result" }, "Regression gate: " + e.message));
      }
      await refresh();
    }

    async function refresh() {
      const rollouts = (await api("GET", "/admin/rollouts")).data;
      if (!selected && rollouts.length) selected = (rollouts.find((r) => r.state === "canary") || rollouts[rollouts.length - 1]).id;
      list.replaceChildren(
        h("h2", {}, "All rollouts"),
        table(
          [
            ["Id", (r) => h("code", {}, r.id)],
            ["Draft", (r) => `${r.draft}@${r.version}`],
            ["Baseline", (r) => (r.baseline_version ? `${r.draft}@${r.baseline_version}` : "–")],
            ["Canary %", (r) => fmt(r.canary_percent)],
            ["State", (r) => h("span", { class: "badge " + r.state, "data-state": r.state }, r.state.replace("_", " "))],
            ["Guard", (r) => h("span", { class: "muted" }, r.guard_verdict || "")],
            ["Reason", (r) => r.reason || ""],
            ["", (r) => h("span", {}, ACTIONS[r.state].map((a) =>
              h("button", { class: a === "rollback" ? "danger" : "secondary", "data-action": a, onclick: (e) => { e.stopPropagation(); act(r, a); } }, a)))],
          ],
          rollouts,
          {
            onclick: (r) => { selected = r.id; refresh(); },
            rowClass: (r) => (r.id === selected ? "selected" : ""),
            empty: "No rollouts yet: start one above.",
          },
        ),
      );
      const r = rollouts.find((x) => x.id === selected);
      if (r) await drawDetail(detail, r);
    }
    await refresh();
    every(5000, () => refresh().catch(() => {}));
  },
};

function startForm(targets, drafts) {
  const target = h("select", { id: "ro-target" }, targets.map((t) => h("option", { value: t.name }, `${t.name}@${t.version}`)));
  const draft = h("select", { id: "ro-draft" }, drafts.map((d) => h("option", { value: `${d.name}|${d.version}` }, `${d.name}@${d.version} (${d.serving ? "serving: " + d.serving : d.status})`)));
  const percent = h("input", { id: "ro-percent", type: "number", min: 0, max: 100, step: 1, value: 20 });
  const minSamples = h("input", { id: "ro-min-samples", type: "number", min: 1, value: 20 });
  const sticky = h("input", { id: "ro-sticky", type: "checkbox" });
  return h(
    "form",
    {
      class: "card",
      id: "rollout-form",
      onsubmit: async (e) => {
        e.preventDefault();
        const [name, version] = draft.value.split("|");
        const body = {
          target: target.value, draft: name, version, canary_percent: Number(percent.value),
          sticky: sticky.checked, guard: { min_samples: Number(minSamples.value) },
        };
        if (!confirm(`Start a canary: ${name}@${version} takes ${percent.value}% of ${target.value}'s traffic?`)) return;
        const r = await attempt(() => api("POST", "/admin/rollouts", body), "Canary started");
        if (r) location.hash = "#/rollouts?id=" + encodeURIComponent(r.id);
      },
    },
    h("h2", {}, "Start a canary"),
    h("div", { class: "row" },
      h("label", {}, "Target", target), h("label", {}, "Draft version", draft),
      h("label", {}, "Canary %", percent), h("label", {}, "Guard: min samples per arm", minSamples),
      h("label", {}, "Sticky tenants", sticky), h("button", { type: "submit", id: "ro-start" }, "Start canary")),
  );
}

function showGate(box, g) {
  box.replaceChildren(
    h("div", { class: "card", id: "gate-result" },
      h("h2", {}, "Regression gate"),
      h("p", { class: g.passed ? "ok" : "error" }, `${g.passed ? "Passed" : "Failed"}: ${g.reason} (${g.checked} prompts checked)`)),
  );
}

async function drawDetail(box, r) {
  const arm = (v) => `${r.draft}@${v}`;
  const [canary, baseline] = await Promise.all([
    api("GET", `/console/api/live?draft=${encodeURIComponent(arm(r.version))}&window=3600`),
    r.baseline_version ? api("GET", `/console/api/live?draft=${encodeURIComponent(arm(r.baseline_version))}&window=3600`) : { data: [] },
  ]);
  const pair = (field) => [
    { label: `canary ${arm(r.version)}`, points: pointsOf(canary.data, field), color: "#d9482b" },
    { label: `baseline ${r.baseline_version ? arm(r.baseline_version) : "–"}`, points: pointsOf(baseline.data, field), color: "#2357d9" },
  ];
  const armRow = (label, s) => [label, s.requests, pct(s.acceptance), fmt(s.tokens_per_second, 1), fmt(s.p95_ms, 0)];
  const charts = h("div", { class: "grid3" });
  box.replaceChildren(
    h("div", { class: "card" },
      h("h2", {}, `Rollout ${r.id}: canary vs baseline`),
      h("p", {}, "Guard verdict: ", h("b", { id: "guard-verdict" }, r.guard_verdict || "–")),
      table(
        [["Arm", (x) => x[0]], ["Requests", (x) => fmt(x[1])], ["Acceptance", (x) => x[2]], ["Tokens/s", (x) => x[3]], ["p95 ms", (x) => x[4]]],
        [armRow("canary", r.canary), armRow("baseline", r.baseline)],
      )),
    charts,
  );
  lineChart(charts, "Acceptance", pair("acceptance"), { percent: true, id: "ro-chart-acceptance", windowSeconds: 3600 });
  lineChart(charts, "Tokens/s per request", pair("tokens_per_s"), { id: "ro-chart-tps", windowSeconds: 3600 });
  lineChart(charts, "p95 latency", pair("p95_ms"), { unit: " ms", id: "ro-chart-p95", windowSeconds: 3600 });
}
