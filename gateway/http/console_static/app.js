// The console's core: the signed-in key, JSON calls in OpenAI's error shape, a tiny DOM
// builder (text is always set as text, never parsed as HTML), and the hash router.
"use strict";

const Console = {
  key: sessionStorage.getItem("gw.key"),
  who: null, // {role, tenant, key_id}
  views: {}, // name -> {title, admin, render(el, params)}
  timers: [],
};

class ApiError extends Error {
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

// fetch with the bearer key; JSON in and out; errors carry the API's own message.
async function api(method, path, body, { raw = false } = {}) {
  const headers = { authorization: "Bearer " + Console.key };
  if (body !== undefined) headers["content-type"] = "application/json";
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!r.ok) {
    let message = r.status + " " + r.statusText;
    let param = null;
    try {
      const e = (await r.json()).error;
      message = e.message;
      param = e.param;
    } catch (_) { /* not JSON */ }
    throw new ApiError(r.status, message, param);
  }
  return raw ? r : r.json();
}

// h("div", {class: "card", onclick: fn}, "text", child, [children...])
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function fmt(v, digits = 2) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(digits);
  return String(v);
}

function pct(v) {
  return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%";
}

// a big number (or element) with its label under it
function stat(value, label) {
  return h("div", { class: "stat" }, h("b", {}, value), h("span", {}, label));
}

function toast(message, bad = false) {
  const t = document.getElementById("toast");
  t.textContent = message;
  t.className = bad ? "bad" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => (t.hidden = true), 6000);
}

// Run an action, report its outcome; returns the result or null on failure.
async function attempt(fn, done) {
  try {
    const result = await fn();
    if (done) toast(done);
    return result;
  } catch (e) {
    toast(e.message, true);
    return null;
  }
}

function every(ms, fn) {
  Console.timers.push(setInterval(fn, ms));
}

function table(columns, rows, { onclick, empty = "Nothing yet.", rowClass } = {}) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, columns.map(([label]) => h("th", {}, label)))),
    h(
      "tbody",
      {},
      rows.map((row) =>
        h(
          "tr",
          {
            class: [onclick ? "clickable" : "", rowClass ? rowClass(row) : ""].join(" ").trim(),
            onclick: onclick ? () => onclick(row) : null,
          },
          columns.map(([, cell]) => h("td", {}, cell(row))),
        ),
      ),
    ),
  );
}

function isAdmin() {
  return Console.who && Console.who.role === "admin";
}

async function route() {
  Console.timers.forEach(clearInterval);
  Console.timers = [];
  const [name, query] = (location.hash.replace(/^#\/?/, "") || "").split("?");
  const params = new URLSearchParams(query || "");
  const view = Console.views[name] || Console.views[isAdmin() ? "live" : "audit"];
  const target = Console.views[name] ? name : isAdmin() ? "live" : "audit";
  document.querySelectorAll("nav a").forEach((a) => {
    a.classList.toggle("active", a.dataset.view === target);
    a.hidden = a.hasAttribute("data-admin") && !isAdmin(); // an auditor sees the audit views only
  });
  const el = document.getElementById("view");
  el.replaceChildren();
  document.title = view.title + " · Gateway console";
  if (view.admin && !isAdmin()) {
    el.append(
      h(
        "div",
        { class: "card narrow", id: "forbidden" },
        h("h1", {}, "Admin only"),
        h("p", {}, "This page needs the admin key. Auditor keys read their tenant's audit records: "),
        h("a", { href: "#/audit" }, "open the audit view"),
      ),
    );
    return;
  }
  try {
    await view.render(el, params);
  } catch (e) {
    el.append(h("p", { class: "error" }, e.message));
  }
}

async function signIn(key) {
  Console.key = key;
  const who = await api("GET", "/console/api/whoami");
  Console.who = who;
  sessionStorage.setItem("gw.key", key);
  document.getElementById("signin-view").hidden = true;
  document.getElementById("view").hidden = false;
  document.getElementById("nav").hidden = false;
  document.getElementById("signout").hidden = false;
  const badge = document.getElementById("who");
  badge.textContent = who.role === "admin" ? "admin" : `auditor · ${who.tenant}`;
  badge.hidden = false;
  await route();
}

function signOut() {
  sessionStorage.removeItem("gw.key");
  Console.key = null;
  Console.who = null;
  location.hash = "";
  location.reload();
}
