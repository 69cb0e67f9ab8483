// Policy: the active bundle and its revision, a tenant document editor that validates
// before it saves, and the dry-run resolve of a sample request.
"use strict";

const SAMPLE_REQUEST = {
  endpoint: "completions",
  max_tokens: 128,
  temperature: 0,
  decoding: { mode: "auto" },
};

Console.views.policy = {
  title: "Policy",
  admin: true,
  async render(el) {
    const p = await api("GET", "/admin/policies");
    const tenants = (await api("GET", "/admin/tenants")).data.map((t) => t.id);
    const bundle = p.bundle;
    el.append(
      h("h1", {}, "Policy"),
      h("div", { class: "card stats", id: "policy-active" },
        stat(h("code", { id: "policy-revision" }, p.revision.slice(0, 16)), "active revision"),
        stat(p.version, "version"),
        stat(Object.keys(bundle.tenants || {}).length, "tenant documents")),
      h("div", { class: "grid2" }, editorCard(bundle, tenants), resolveCard(tenants)),
      h("details", { class: "card" }, h("summary", {}, "The whole active bundle (default and tenant documents)"),
        h("pre", {}, JSON.stringify(bundle, null, 2))),
    );
  },
};

function editorCard(bundle, tenants) {
  const select = h("select", { id: "pol-tenant" }, tenants.map((t) => h("option", { value: t }, t)));
  const text = h("textarea", { id: "pol-doc", spellcheck: "false" });
  const result = h("p", { id: "pol-result", role: "status" });
  const save = h("button", { id: "pol-save", disabled: true }, "Save");
  let validated = null;
  const load = () => {
    const doc = (bundle.tenants || {})[select.value] || {};
    text.value = JSON.stringify(doc, null, 2);
    validated = null;
    save.disabled = true;
    result.textContent = "Edit, then validate: saving is possible once the document validates.";
    result.className = "muted";
  };
  select.addEventListener("change", load);
  text.addEventListener("input", () => { validated = null; save.disabled = true; });
  const parse = () => {
    try {
      const doc = JSON.parse(text.value);
      if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw new Error("the document must be a JSON object");
      return doc;
    } catch (e) {
      result.textContent = "Not valid JSON: " + e.message;
      result.className = "error";
      return null;
    }
  };
  const validate = async () => {
    const doc = parse();
    if (!doc) return;
    try {
      const v = await api("POST", "/console/api/policy/validate", { tenant: select.value, document: doc });
      validated = text.value;
      save.disabled = false;
      result.textContent = `Valid. Saving makes revision ${v.revision.slice(0, 16)} active.`;
      result.className = "ok";
    } catch (e) {
      result.textContent = e.message;
      result.className = "error";
    }
  };
  save.addEventListener("click", async () => {
    if (validated !== text.value) return;
    if (!confirm(`Replace ${select.value}'s policy document? It applies to the next request.`)) return;
    const out = await attempt(() => api("PUT", `/admin/policies/tenants/${encodeURIComponent(select.value)}`, JSON.parse(text.value)), "Policy saved");
    if (out) route();
  });
  if (tenants.length) load();
  return h("div", { class: "card" },
    h("h2", {}, "Tenant document"),
    tenants.length ? h("div", {}, h("label", {}, "Tenant", select), text,
      h("div", { class: "row" }, h("button", { class: "secondary", id: "pol-validate", onclick: validate }, "Validate"), save), result)
      : h("p", { class: "empty" }, "No tenants yet."));
}

function resolveCard(tenants) {
  const select = h("select", { id: "res-tenant" }, tenants.map((t) => h("option", { value: t }, t)));
  const text = h("textarea", { id: "res-request", spellcheck: "false" });
  text.value = JSON.stringify(SAMPLE_REQUEST, null, 2);
  const out = h("div", { id: "res-out" });
  const run = async () => {
    let request;
    try { request = JSON.parse(text.value); } catch (e) { out.replaceChildren(h("p", { class: "error" }, "Not valid JSON: " + e.message)); return; }
    try {
      const d = await api("POST", "/admin/policies/resolve", { tenant: select.value, request });
      const decision = d.decision || d;
      out.replaceChildren(
        h("dl", { class: "detail" },
          ["mode", "proposer", "draft_version", "k_min", "k_max", "k", "auto_outcome", "policy_revision"].map((k) => [
            h("dt", {}, k), h("dd", {}, fmt(decision[k])),
          ]),
          h("dt", {}, "reason codes"), h("dd", {}, (decision.reason_codes || []).map((c) => h("span", { class: "chip" }, c))),
          h("dt", {}, "rule ids"), h("dd", {}, (decision.rule_ids || []).map((c) => h("span", { class: "chip" }, c)))),
      );
    } catch (e) {
      out.replaceChildren(h("p", { class: "error" }, e.message));
    }
  };
  return h("div", { class: "card" },
    h("h2", {}, "Dry run: which decision would a request get?"),
    h("label", {}, "Tenant", select),
    h("label", {}, "Request (a completion body; only the features the policy reads matter)", text),
    h("button", { id: "res-run", onclick: run }, "Resolve"),
    out);
}
