// Audit: records with the filters of /audit/records, a record's detail (decision reasons,
// models, trace id), export as JSON lines or CSV, chain verification, the signed
// checkpoints of the verifiable log (with a record's inclusion proof checked here, in the
// browser), and (admin key) the admin events: tenants, keys, policies, rollouts.
"use strict";

// RFC 9162 inclusion proofs, checked with WebCrypto's SHA-256 (docs/audit.md, "The
// verifiable log"): leaf = SHA-256(0x00 || kind "\n" record_hash), node = SHA-256(0x01 ||
// left || right). Pure functions (tests/unit/audit/test_console_proofs.py runs them in node).
const LogProof = {
  async sha256(...parts) {
    const size = parts.reduce((n, p) => n + p.length, 0);
    const all = new Uint8Array(size);
    let at = 0;
    for (const p of parts) { all.set(p, at); at += p.length; }
    return new Uint8Array(await globalThis.crypto.subtle.digest("SHA-256", all));
  },
  b64(text) {
    return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  },
  equal(a, b) {
    return a.length === b.length && a.every((x, i) => x === b[i]);
  },
  async leaf(kind, recordHash) {
    return LogProof.sha256(new Uint8Array([0]), new TextEncoder().encode(kind + "\n" + recordHash));
  },
  node(left, right) {
    return LogProof.sha256(new Uint8Array([1]), left, right);
  },
  // {origin, size, root} of a signed checkpoint note (its first three lines)
  checkpoint(note) {
    const [origin, size, root] = note.split("\n");
    return { origin, size: Number(size), root: LogProof.b64(root) };
  },
  // RFC 9162 2.1.3.2: true when `leaf` is leaf `index` of the tree of `size` with `root`
  async verifyInclusion(leaf, index, size, proof, root) {
    if (!(index >= 0 && index < size)) return false;
    let fn = index, sn = size - 1, r = leaf;
    for (const p of proof) {
      if (sn === 0) return false;
      if (fn % 2 === 1 || fn === sn) {
        r = await LogProof.node(p, r);
        while (fn % 2 === 0 && fn !== 0) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); }
      } else {
        r = await LogProof.node(r, p);
      }
      fn = Math.floor(fn / 2); sn = Math.floor(sn / 2);
    }
    return sn === 0 && LogProof.equal(r, root);
  },
};

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
      h("button", { class: tab === "verify" ? "on" : "", id: "tab-verify", onclick: () => (location.hash = "#/audit?tab=verify") }, "Verify chain"),
      h("button", { class: tab === "checkpoints" ? "on" : "", id: "tab-checkpoints", onclick: () => (location.hash = "#/audit?tab=checkpoints") }, "Signed checkpoints"));
    el.append(h("h1", {}, "Audit"), tabs);
    if (tab === "events" && isAdmin()) return renderEvents(el);
    if (tab === "verify") return renderVerify(el);
    if (tab === "checkpoints") return renderCheckpoints(el);
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

async function renderCheckpoints(el) {
  const page = await api("GET", "/audit/checkpoints?limit=20");
  const latest = page.data[0];
  const signer = page.signer;
  const head = h("div", { class: "card", id: "checkpoint-latest" }, h("h2", {}, "Latest signed checkpoint"));
  if (!latest) {
    head.append(h("p", { class: "muted", id: "checkpoint-none" }, "No checkpoint signed yet (the job signs one within its interval once records arrive)."));
  } else {
    const cp = LogProof.checkpoint(latest.note);
    const witnessed = latest.witnesses.length;
    head.append(
      h("div", { class: "row" },
        stat(fmt(latest.tree_size), "leaves covered"),
        stat(latest.created_at.slice(0, 19).replace("T", " "), "signed (UTC)"),
        stat(h("span", { class: "badge " + (witnessed ? "ok" : "bad"), id: "checkpoint-witness" }, witnessed ? `cosigned by ${witnessed}` : "no witness"), "witness")),
      h("dl", { class: "detail" },
        h("dt", {}, "origin"), h("dd", { class: "mono" }, cp.origin),
        h("dt", {}, "root"), h("dd", { class: "mono", id: "checkpoint-root" }, latest.root_hash),
        h("dt", {}, "key id"), h("dd", { class: "mono" }, latest.key_id),
        h("dt", {}, "witnesses"), h("dd", {}, latest.witnesses.map((w) => h("span", { class: "chip" }, w.witness))),
        signer ? [h("dt", {}, "this replica's sinks"), h("dd", { id: "checkpoint-sinks" }, Object.entries(signer.sinks).map(([k, v]) => h("div", {}, `${k}: ${v}`)), signer.error ? h("div", { class: "error" }, signer.error) : "")] : ""),
      h("pre", { class: "mono", id: "checkpoint-note" }, latest.cosigned));
  }
  const result = h("p", { id: "proof-result" });
  const input = h("input", { id: "proof-record", size: 10, placeholder: "record id" });
  const check = h("form", { class: "card", id: "proof-form", onsubmit: async (e) => { e.preventDefault(); await checkRecord(input.value.trim(), result); } },
    h("h2", {}, "Check a record's inclusion proof (in this browser)"),
    h("p", { class: "muted" }, "Recomputes the record's leaf from its hash and walks its audit path to the signed root. The offline verifier also recomputes the hash from every field and checks the signature (docs/audit.md)."),
    h("div", { class: "row" }, input, h("button", { type: "submit", id: "proof-check" }, "Verify")), result);
  const keys = h("div", { class: "card", id: "checkpoint-keys" }, h("h2", {}, "Signing keys (give auditors these)"),
    page.keys.map((k) => h("div", { class: "mono" }, k.vkey)));
  const list = h("div", { class: "card" }, h("h2", {}, "Recent checkpoints"),
    table([["Id", (c) => c.id], ["Leaves", (c) => c.tree_size], ["Signed", (c) => c.created_at.slice(0, 19).replace("T", " ")],
      ["Root", (c) => h("code", {}, c.root_hash.slice(0, 16) + "…")], ["Witnesses", (c) => c.witnesses.length]], page.data, { empty: "None yet." }));
  const stored = Console.who && !Console.who.tenant ? h("div", { class: "card", id: "log-verify" },
    h("h2", {}, "The stored log against its rows and checkpoints"),
    h("p", { class: "muted" }, "Inside the database, trusting it: an alarm, not the auditor's proof."),
    h("button", { class: "secondary", id: "log-verify-run", onclick: async (e) => {
      const v = await attempt(() => api("GET", "/audit/log/verify"));
      if (!v) return;
      const bad = v.first_mismatch || v.checkpoints.first_bad;
      e.target.replaceWith(h("p", { id: "log-verify-result", class: v.ok ? "ok" : "error" },
        v.ok ? `Intact: ${v.leaves} leaves, ${v.checkpoints.checked} checkpoints hold.` : `BROKEN: ${JSON.stringify(bad)}`));
    } }, "Check")) : "";
  el.append(head, check, keys, stored, list);
}

async function checkRecord(id, out) {
  try {
    const record = await api("GET", `/audit/records/${encodeURIComponent(id)}`);
    const proof = await api("GET", `/audit/records/${encodeURIComponent(id)}/proof`);
    const cp = LogProof.checkpoint(proof.checkpoint);
    const leaf = await LogProof.leaf("record", record.record_hash);
    const sameLeaf = LogProof.equal(leaf, LogProof.b64(proof.leaf_hash));
    const ok = sameLeaf && cp.size === proof.tree_size &&
      (await LogProof.verifyInclusion(leaf, proof.leaf_index, proof.tree_size, proof.hashes.map(LogProof.b64), cp.root));
    out.className = ok ? "ok" : "error";
    out.textContent = ok
      ? `Record ${id} is leaf ${proof.leaf_index} of the signed log of ${proof.tree_size} leaves: its ${proof.hashes.length} proof hashes lead to the signed root.`
      : `Record ${id}: the proof does NOT lead to the signed root${sameLeaf ? "" : " (its leaf is not the record's hash)"}.`;
  } catch (e) {
    out.className = "error";
    out.textContent = e.message;
  }
}
