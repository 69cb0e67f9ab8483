// Tenants and their keys: create a tenant, issue tenant or auditor keys (the secret is shown
// once, here), revoke, rotate (a new key of the same role, then the old one revoked).
"use strict";

Console.views.tenants = {
  title: "Tenants & keys",
  admin: true,
  async render(el, params) {
    const selected = params.get("tenant");
    const tenants = (await api("GET", "/admin/tenants")).data;
    const secret = h("div", { id: "secret-box" });
    const id = h("input", { id: "tenant-id", placeholder: "team-a", pattern: "[a-z0-9][a-z0-9_\\-]{0,62}", required: true });
    const name = h("input", { id: "tenant-name", placeholder: "Team A", required: true });
    const form = h(
      "form",
      {
        class: "row",
        id: "tenant-form",
        onsubmit: async (e) => {
          e.preventDefault();
          const t = await attempt(() => api("POST", "/admin/tenants", { id: id.value, name: name.value }), `Tenant ${id.value} created`);
          if (t) location.hash = "#/tenants?tenant=" + encodeURIComponent(t.id);
        },
      },
      h("label", {}, "Tenant id (a-z, 0-9, - and _)", id),
      h("label", {}, "Name", name),
      h("button", { type: "submit" }, "Create tenant"),
    );
    el.append(
      h("h1", {}, "Tenants & keys"),
      h("div", { class: "card" }, h("h2", {}, "New tenant"), form),
      secret,
      h(
        "div",
        { class: "card" },
        h("h2", {}, `Tenants (${tenants.length})`),
        table(
          [["Id", (t) => h("code", {}, t.id)], ["Name", (t) => t.name], ["Created", (t) => t.created_at.slice(0, 19).replace("T", " ")]],
          tenants,
          {
            onclick: (t) => (location.hash = "#/tenants?tenant=" + encodeURIComponent(t.id)),
            rowClass: (t) => (t.id === selected ? "selected" : ""),
            empty: "No tenants yet.",
          },
        ),
      ),
    );
    if (selected) el.append(await keysCard(selected, secret));
  },
};

function showSecret(box, issued) {
  box.replaceChildren(
    h(
      "div",
      { class: "secret card", id: "secret" },
      h("h2", {}, `New ${issued.role} key for ${issued.tenant_id}`),
      h("p", {}, "Copy it now: it is shown once, only its hash is kept."),
      h("p", {}, h("code", { id: "secret-value" }, issued.key)),
      h("p", { class: "muted" }, "Key id ", h("code", {}, issued.id)),
    ),
  );
}

async function keysCard(tenant, secretBox) {
  const keys = (await api("GET", `/console/api/tenants/${encodeURIComponent(tenant)}/keys`)).data;
  const reload = () => route();
  const issue = async (role) => {
    const k = await attempt(() => api("POST", `/admin/tenants/${encodeURIComponent(tenant)}/keys`, { role }), `${role} key issued`);
    if (k) {
      await reload();
      showSecret(document.getElementById("secret-box"), k);
    }
  };
  const revoke = async (k) => {
    if (!confirm(`Revoke key ${k.id} (${k.role}) of ${tenant}? Requests with it fail at once.`)) return;
    if (await attempt(() => api("DELETE", `/admin/keys/${encodeURIComponent(k.id)}`), `Key ${k.id} revoked`)) await reload();
  };
  const rotate = async (k) => {
    if (!confirm(`Rotate key ${k.id}: issue a new ${k.role} key, then revoke this one?`)) return;
    const fresh = await attempt(() => api("POST", `/admin/tenants/${encodeURIComponent(tenant)}/keys`, { role: k.role }));
    if (!fresh) return;
    await attempt(() => api("DELETE", `/admin/keys/${encodeURIComponent(k.id)}`), `Key ${k.id} rotated`);
    await reload();
    showSecret(document.getElementById("secret-box"), fresh);
  };
  return h(
    "div",
    { class: "card", id: "keys" },
    h("h2", {}, `Keys of ${tenant}`),
    h(
      "div",
      { class: "row" },
      h("button", { id: "issue-tenant-key", onclick: () => issue("tenant") }, "Issue tenant key"),
      h("button", { class: "secondary", id: "issue-auditor-key", onclick: () => issue("auditor") }, "Issue auditor key"),
    ),
    h("h3", {}, "Issued"),
    table(
      [
        ["Id", (k) => h("code", {}, k.id)],
        ["Role", (k) => k.role],
        ["Prefix", (k) => h("code", {}, k.prefix || "")],
        ["Created", (k) => String(k.created_at || "").slice(0, 19).replace("T", " ")],
        ["State", (k) => (k.revoked_at ? h("span", { class: "badge bad" }, "revoked") : h("span", { class: "badge ok" }, "active"))],
        [
          "",
          (k) =>
            k.revoked_at
              ? ""
              : h("span", {}, h("button", { class: "secondary", onclick: () => rotate(k) }, "Rotate"), " ",
                  h("button", { class: "danger", onclick: () => revoke(k), "data-key": k.id }, "Revoke")),
        ],
      ],
      keys,
      { empty: "No keys yet." },
    ),
  );
}
