// Audit: records with the filters of /audit/records, a record's detail (decision reasons,
// models, trace id), export as JSON lines or CSV, chain verification, and (admin key) the
// admin events: tenants, keys, policies, rollouts.
"use strict";

const FILTERS = [
  ["tenant", "Tenant"], ["since", "Since (ISO, with Z)"], ["until", "Until"], ["mode", "Mode"],
  ["status", "Status"], ["target_model", "Target model"], ["draft_model", "Draft model"],
  ["draft_version", "Draft version"], ["decision_id", "Decision id"], ["user", "End user"],
  ["trace_id", "Trace id"],
];

Console.views.audit = {
  title: "Audit",
  admin: false,
  async render(el, params) {
    const tab = params.get("tab") || "records";
    const tabs = h("div", { class: "tabs" },
      h("button", { class: tab === "records" ? "on" : "", id: "tab-records", onclick: () => (location.hash = "#/audit") }, "Request records"),
      isAdmin() ? h("button", { class: tab === "events" ? "on" : "", id: "tab-events", onclick: () => (location.hash = "#/audit?tab=events") }, "Admin events") : null,
      h("button", { class: tab === "verify" ? "on" : "", id: "tab-verify", onclick: () => (location.hash = "#/audit?tab=verify") }, "Verify chain"));
    el.append(h("h1", {}, "Audit"), tabs);
    if (tab === "events" && isAdmin()) return renderEvents(el);
    if (tab === "verify") return renderVerify(el);
    return renderRecords(el, params);
  },
};

function filterQuery(form) {
  const q = new URLSearchParams();
  for (const [name] of FILTERS) {
    const input = form.querySelector(`[name=${name}]`);
    if (input && input.value.trim()) q.set(name, input.value.trim());
  }
  return q;
}

async function renderRecords(el, params) {
  const inputs = FILTERS.filter(([n]) => n !== "tenant" || isAdmin()).map(([name, label]) =>
    h("label", {}, label, h("input", { name, id: "f-" + name, value: params.get(name) || "", size: name.endsWith("_id") ? 34 : 14 })));
  const results = h("div", { class: "card", id: "records" });
  const detail = h("div", { id: "record-detail" });
  let cursor = null;
  let shown = [];
  const form = h("form", { class: "card", id: "audit-filters", onsubmit: (e) => { e.preventDefault(); cursor = null; shown = []; search(); } },
    h("div", { class: "row" }, inputs, h("button", { type: "submit", id: "audit-search" }, "Search")),
    h("div", { class: "row spaced" },
      h("button", { type: "button", class: "secondary", id: "export-jsonl", onclick: () => exportAs("jsonl") }, "Export JSON lines"),
      h("button", { type: "button", class: "secondary", id: "export-csv", onclick: () => exportAs("csv") }, "Export CSV"),
      h("span", { class: "muted" }, isAdmin() ? "" : `Auditor key: tenant ${Console.who.tenant} only.`)));
  el.append(form, results, detail);

  async function search() {
    const q = filterQuery(form);
    q.set("limit", "50");
    if (cursor) q.set("cursor", cursor);
    try {
      const page = await api("GET", "/audit/records?" + q);
      shown = shown.concat(page.data);
      cursor = page.next_cursor;
      results.replaceChildren(
        h("h2", {}, `Records (${shown.length}${cursor ? "+" : ""})`),
        table(
          [
            ["Id", (r) => r.id], ["Time", (r) => r.created_at.slice(0, 19).replace("T", " ")],
            ["Tenant", (r) => r.tenant_id || "–"], ["Endpoint", (r) => r.endpoint], ["Status", (r) => r.status],
            ["Mode", (r) => r.mode || "–"], ["Draft", (r) => (r.draft_model ? `${r.draft_model}@${r.draft_version}` : "–")],
            ["Tokens", (r) => `${r.prompt_tokens} → ${r.completion_tokens}`],
            ["Accepted", (r) => (r.drafted_tokens ? `${r.accepted_tokens}/${r.drafted_tokens}` : "–")],
            ["Latency", (r) => (r.latency_ms === null ? "–" : fmt(r.latency_ms, 0) + " ms")],
            ["Trace", (r) => (r.trace_id ? h("code", {}, r.trace_id.slice(0, 8) + "…") : "–")],
          ],
          shown,
          { onclick: (r) => showRecord(detail, r.id), empty: "No record matches." },
        ),
        cursor ? h("button", { class: "secondary", id: "audit-more", onclick: search }, "Older records") : "",
      );
    } catch (e) {
      results.replaceChildren(h("p", { class: "error", id: "audit-error" }, e.message));
    }
  }

  async function exportAs(format) {
    const q = filterQuery(form);
    q.set("format", format);
    const r = await attempt(() => api("GET", "/audit/export?" + q, undefined, { raw: true }));
    if (!r) return;
    const blob = await r.blob();
    const a = h("a", { href: URL.createObjectURL(blob), download: `audit.${format}` });
    document.body.append(a);
    a.click();
    a.remove();
    toast(`Exported audit.${format} (${blob.size} bytes)`);
  }
  await search();
}

async function showRecord(box, id) {
  const r = await api("GET", `/audit/records/${id}`);
  const order = ["request_id", "decision_id", "trace_id", "tenant_id", "key_id", "created_at", "endpoint", "status",
    "error_type", "requested_mode", "mode", "policy_revision", "proposer", "target_model", "target_version",
    "draft_model", "draft_version", "k_min", "k_max", "drafted_tokens", "accepted_tokens", "prompt_tokens",
    "completion_tokens", "latency_ms", "ttft_ms", "temperature", "top_p", "seed", "constraint",
    "prompt_sha256", "completion_sha256", "user_sha256", "tool_names", "record_hash", "prev_hash"];
  box.replaceChildren(
    h("div", { class: "card", id: "record" },
      h("h2", {}, `Record ${r.id}`),
      h("dl", { class: "detail" },
        h("dt", {}, "reason codes"), h("dd", { id: "record-reasons" }, (r.reason_codes || []).map((c) => h("span", { class: "chip" }, c))),
        order.filter((k) => k in r).map((k) => [h("dt", {}, k), h("dd", { class: k.endsWith("_id") || k.endsWith("hash") || k.endsWith("sha256") ? "mono" : "", "data-field": k }, fmt(Array.isArray(r[k]) ? r[k].join(", ") : r[k]))]))),
  );
  box.scrollIntoView({ behavior: "instant", block: "start" });
}

async function renderEvents(el) {
  const page = await api("GET", "/audit/events?limit=200");
  el.append(h("div", { class: "card", id: "events" },
    h("h2", {}, "Admin events (newest first)"),
    table(
      [
        ["Id", (e) => e.id], ["Time", (e) => e.created_at.slice(0, 19).replace("T", " ")],
        ["Actor", (e) => e.actor], ["Action", (e) => h("code", { "data-action": e.action }, e.action)], ["Subject", (e) => e.subject],
        ["Change", (e) => h("code", {}, e.after ? JSON.stringify(e.after).slice(0, 160) : "")],
      ],
      page.data,
      { empty: "No admin events." },
    )));
}

async function renderVerify(el) {
  const box = h("div", { class: "card", id: "verify" }, h("p", { class: "muted" }, "Walks both hash chains and the kept payloads."));
  const run = async () => {
    const v = await attempt(() => api("GET", "/audit/verify"));
    if (!v) return;
    const line = (name, x) => h("tr", {}, h("td", {}, name), h("td", {}, h("span", { class: "badge " + (x.ok ? "ok" : "bad") }, x.ok ? "intact" : "BROKEN")),
      h("td", {}, fmt(x.checked)), h("td", {}, fmt(x.first_broken)), h("td", { class: "mono" }, x.head ? String(x.head).slice(0, 16) + "…" : "–"));
    box.replaceChildren(
      h("h2", { id: "verify-result", class: v.ok ? "ok" : "error" }, v.ok ? "Chain verified: intact" : "Chain BROKEN"),
      h("table", {}, h("thead", {}, h("tr", {}, ["Chain", "State", "Checked", "First broken", "Head"].map((x) => h("th", {}, x)))),
        h("tbody", {}, line("request records", { ok: v.records_ok, checked: v.checked, first_broken: v.first_broken, head: v.head }),
          line("admin events", v.admin_events), line("payloads", v.payloads))),
      h("button", { class: "secondary", onclick: run }, "Verify again"));
  };
  el.append(box);
  await run();
}
