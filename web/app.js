// tally's billing dashboard. It reads and writes tally only through the public
// /v1 API, with the person's session cookie and the CSRF token sign-in returns
// (docs/api.md). Money arrives as integer nano-dollars and is formatted with
// integer arithmetic (exact below 2^53 nano-dollars, $9 million); only the
// charts' y coordinates are plotted as floating point.
"use strict";

const REFRESH_MS = 5000;
const $ = (sel, root = document) => root.querySelector(sel);
let csrf = sessionStorage.getItem("tally_csrf") || "";
let timer = null;
const charts = {};
const keyNames = new Map(); // key id → name, from /v1/spend

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error && body.error.code;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrf;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  const json = text ? JSON.parse(text) : null;
  if (!res.ok) throw new ApiError(res.status, json);
  return json;
}

// Every page of a cursor-paginated list.
async function all(path, field = "data") {
  const out = [];
  let cursor = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api("GET", path + sep + "limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
    out.push(...page[field]);
    cursor = page.next_cursor;
  } while (cursor);
  return out;
}

// nano-dollars → "$1.234567" (rounded half away from zero to the micro-dollar).
function money(nd) {
  if (nd === null || nd === undefined) return "—";
  const neg = nd < 0;
  let micro = Math.floor((Math.abs(nd) + 500) / 1000);
  const whole = Math.floor(micro / 1000000);
  const frac = String(micro % 1000000).padStart(6, "0");
  return (neg ? "-$" : "$") + whole.toLocaleString("en-US") + "." + frac;
}

// "0.25" (dollars, up to 9 decimals) → 250000000 nano-dollars, exactly; null when not a number.
function parseDollars(s) {
  const m = /^\s*\$?\s*(\d{1,9})(?:\.(\d{0,9}))?\s*$/.exec(s);
  if (!m) return null;
  return Number(m[1]) * 1000000000 + Number((m[2] || "").padEnd(9, "0"));
}

// nano-dollars → "0.25" for the limit form.
function dollarsText(nd) {
  if (nd === null || nd === undefined) return "";
  const frac = String(nd % 1000000000).padStart(9, "0").replace(/0+$/, "");
  return String(Math.floor(nd / 1000000000)) + (frac ? "." + frac : "");
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function setRows(tbody, rows, cols) {
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colSpan: cols }, "none"))]));
}

// ---- sign-in ----

async function signIn(ev) {
  ev.preventDefault();
  const f = ev.target;
  $("#signin-error").textContent = "";
  try {
    const s = await api("POST", "/v1/sessions", { email: f.email.value, password: f.password.value });
    csrf = s.csrf_token;
    sessionStorage.setItem("tally_csrf", csrf);
    f.password.value = "";
    await start();
  } catch (e) {
    $("#signin-error").textContent = e.status === 401 ? "Wrong email or password." : e.message;
  }
}

async function signOut() {
  try { await api("DELETE", "/v1/sessions/current"); } catch (e) { /* already gone */ }
  csrf = "";
  sessionStorage.removeItem("tally_csrf");
  showSignIn();
}

function showSignIn() {
  clearInterval(timer);
  $("#app").hidden = true;
  $("#signout").hidden = true;
  $("#refresh").hidden = true;
  $("#signin-section").hidden = false;
  $("#who").textContent = "";
}

async function start() {
  let me;
  try {
    me = await api("GET", "/v1/sessions/current");
  } catch (e) {
    showSignIn();
    return;
  }
  if (!csrf) { showSignIn(); return; } // a session from another tab: sign in again for a CSRF token
  $("#who").textContent = `${me.email || me.person} · account ${me.account}`;
  $("#signin-section").hidden = true;
  $("#app").hidden = false;
  $("#signout").hidden = false;
  $("#refresh").hidden = false;
  await refresh();
  schedule();
}

function schedule() {
  clearInterval(timer);
  if ($("#live").checked) timer = setInterval(refresh, REFRESH_MS);
}

// ---- the sections ----

// One refresh at a time; asked while one runs, it runs again after it, so what a
// click (or the timer) shows was read after the click, never before.
let refreshing = null;
async function refresh() {
  while (refreshing) await refreshing;
  refreshing = (async () => {
    try {
      await spend(); // first: the other sections name keys by the names it reads
      await Promise.all([sandboxes(), alerts(), usage(), invoices()]);
      document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
    } catch (e) {
      if (e.status === 401) { showSignIn(); return; }
      $("#asof").textContent = "refresh failed: " + e.message;
    }
  })();
  try { await refreshing; } finally { refreshing = null; }
}

async function spend() {
  const rows = [];
  let cursor = null, first = null;
  do {
    const page = await api("GET", "/v1/spend?limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
    first = first || page;
    rows.push(...page.data);
    cursor = page.next_cursor;
  } while (cursor);
  $("#day").textContent = `(UTC day ${first.day})`;
  $("#asof").textContent = "as of " + first.as_of.replace("T", " ").replace(/\.\d+/, "");
  $("#asof").dataset.asOf = first.as_of;
  const tbody = $("#spend tbody");
  const keep = new Set();
  for (const k of rows) {
    keep.add(k.key);
    keyNames.set(k.key, k.name || k.key);
    let tr = tbody.querySelector(`tr[data-key="${CSS.escape(k.key)}"]`);
    if (!tr) {
      tr = el("tr", { "data-key": k.key });
      for (let i = 0; i < 6; i++) tr.append(el("td"));
      const form = el("form", { class: "limit", "data-key": k.key },
        el("input", { name: "limit", placeholder: "no limit", inputMode: "decimal" }),
        el("button", { type: "submit" }, "Save"));
      form.addEventListener("submit", setLimit);
      tr.append(el("td", {}, form));
      tbody.querySelector("td.empty")?.parentElement.remove();
      tbody.append(tr);
    }
    const [name, spendTd, limitTd, barTd, burnTd, stateTd] = tr.children;
    name.replaceChildren(el("strong", {}, k.name || k.key), " ", el("span", { class: "muted" }, k.key));
    spendTd.className = "num spend";
    spendTd.dataset.nanodollars = String(k.spend_nanodollars);
    spendTd.textContent = money(k.spend_nanodollars);
    limitTd.className = "num limit";
    limitTd.dataset.nanodollars = k.limit_nanodollars === null ? "" : String(k.limit_nanodollars);
    limitTd.textContent = k.limit_nanodollars === null ? "none" : money(k.limit_nanodollars) + " " + k.limit_policy;
    if (k.limit_nanodollars) {
      const pct = Math.min(100, Math.floor(k.spend_nanodollars * 100 / k.limit_nanodollars));
      barTd.replaceChildren(el("span", { class: "bar" + (pct >= 100 ? " bad" : pct >= 80 ? " warn" : "") },
        el("span", { style: `width:${pct}%` })), ` ${pct}%`);
      barTd.firstChild.firstChild.style.width = pct + "%";
    } else {
      barTd.replaceChildren(el("span", { class: "muted" }, "no limit"));
    }
    burnTd.className = "num";
    burnTd.textContent = money(k.burn_rate_nanodollars_per_hour) +
      (k.reaches_limit_at ? ` (limit at ${k.reaches_limit_at.slice(11, 16)} UTC)` : "");
    stateTd.className = k.blocked ? "state-blocked" : "";
    stateTd.textContent = k.blocked ? "blocked today" : k.limit_reached ? "limit reached" : "ok";
    const input = tr.querySelector("input[name=limit]");
    if (document.activeElement !== input && !input.dataset.dirty) input.value = dollarsText(k.limit_nanodollars);
    tr.dataset.policy = k.limit_policy || "pause";
  }
  for (const tr of [...tbody.querySelectorAll("tr[data-key]")]) if (!keep.has(tr.dataset.key)) tr.remove();
  if (!rows.length) setRows(tbody, [], 7);
}

async function setLimit(ev) {
  ev.preventDefault();
  const form = ev.target, key = form.dataset.key, input = form.limit;
  const msg = $("#limit-message");
  try {
    let answer;
    if (input.value.trim() === "") {
      answer = await api("DELETE", `/v1/keys/${encodeURIComponent(key)}/limit`);
    } else {
      const nd = parseDollars(input.value);
      if (nd === null) { msg.textContent = "A limit is dollars, e.g. 0.50 (up to 9 decimals)."; return; }
      const policy = form.closest("tr").dataset.policy || "pause";
      answer = await api("PUT", `/v1/keys/${encodeURIComponent(key)}/limit`, { daily_limit_nanodollars: nd, policy });
    }
    delete input.dataset.dirty;
    msg.textContent = `${key}: daily limit ${answer.daily_limit_nanodollars === null ? "removed" : "set to " + money(answer.daily_limit_nanodollars)}` +
      (answer.block_lifted ? " — the block is lifted: new sandboxes may start (paused ones stay paused until resumed)." : ".");
    msg.dataset.saved = key;
    await refresh();
  } catch (e) {
    msg.textContent = `${key}: ${e.message}`;
  }
}

async function sandboxes() {
  const list = await all("/v1/sandboxes?state=running,paused", "sandboxes");
  const full = await Promise.all(list.map((s) => api("GET", `/v1/sandboxes/${encodeURIComponent(s.id)}`).catch(() => s)));
  const rows = full.map((s) => el("tr", { "data-sandbox": s.id },
    el("td", {}, el("code", {}, s.id)),
    el("td", { title: s.key || "" }, keyNames.get(s.key) || s.key || ""),
    el("td", {}, Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ")),
    el("td", { class: "state-" + s.state }, s.state),
    el("td", { class: "num" }, s.vcpus ?? ""),
    el("td", { class: "num" }, s.memory_mib ? `${s.memory_mib} MiB` : ""),
    el("td", { class: "num cost", "data-nanodollars": String(s.cost_nanodollars ?? "") }, money(s.cost_nanodollars))));
  setRows($("#sandboxes tbody"), rows, 7);
}

async function alerts() {
  const page = await api("GET", "/v1/alerts?limit=20");
  const rows = page.data.map((a) => el("tr", {},
    el("td", {}, a.created_at.replace("T", " ").replace(/\.\d+/, "")),
    el("td", { title: a.key }, keyNames.get(a.key) || a.key), el("td", {}, a.day),
    el("td", { class: "num" }, a.type === "spend.limit_projected"
      ? "projected by " + (a.projected_at || "").replace("T", " ").replace(/:\d\dZ$/, "")
      : a.threshold_pct + "%"),
    el("td", { class: "num" }, money(a.spend_nanodollars)),
    el("td", { class: "num" }, money(a.limit_nanodollars)),
    el("td", {}, a.state === "delivered" ? "delivered " + (a.delivered_at || "").replace("T", " ").replace(/\.\d+/, "")
      : a.state === "no_destination" ? "no destination set" : a.state)));
  setRows($("#alerts tbody"), rows, 7);
}

function hourIso(ms) { return new Date(ms).toISOString().replace(/\.\d+Z$/, "Z"); }

async function usage() {
  const hour = 3600 * 1000;
  const to = Math.floor(Date.now() / hour) * hour + hour, from = to - 12 * hour;
  const q = `/v1/usage?from=${hourIso(from)}&to=${hourIso(to)}&granularity=hour`;
  const [byMeter, byLabel] = await Promise.all([all(q), all(q + "&group_by=label:agent")]);
  const xs = [];
  for (let t = from; t < to; t += hour) xs.push(t / 1000);
  draw("meter", xs, byMeter, (r) => r.meter);
  draw("label", xs, byLabel, (r) => r.group["label:agent"] ?? "(no label)");
}

const COLORS = ["#2f6fdf", "#c77700", "#2e8b57", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d"];

function draw(name, xs, rows, seriesOf) {
  const names = [...new Set(rows.map(seriesOf))].sort();
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = names.map(() => xs.map(() => 0));
  for (const r of rows) {
    const i = index.get(Date.parse(r.period_start) / 1000);
    if (i !== undefined) ys[names.indexOf(seriesOf(r))][i] += r.cost_nanodollars;
  }
  // Plotted in dollars (display only: the figures in the tables are exact).
  const data = [xs, ...ys.map((s) => s.map((nd) => nd / 1e9))];
  const box = $("#chart-" + name);
  const sig = names.join("|");
  if (charts[name] && charts[name].sig === sig) { charts[name].plot.setData(data); return; }
  if (charts[name]) charts[name].plot.destroy();
  box.replaceChildren();
  if (!names.length) { box.append(el("p", { class: "empty" }, "no usage in these hours yet")); delete charts[name]; return; }
  const opts = {
    width: Math.max(300, box.clientWidth), height: 240,
    series: [{}, ...names.map((n, i) => ({
      label: n, stroke: COLORS[i % COLORS.length], width: 2, fill: COLORS[i % COLORS.length] + "22",
      points: { show: true }, value: (u, v) => (v == null ? "—" : "$" + v.toFixed(6)),
    }))],
    axes: [{}, { values: (u, vals) => vals.map((v) => "$" + v.toFixed(4)), size: 70 }],
    scales: { x: { time: true } },
  };
  charts[name] = { sig, plot: new uPlot(opts, data, box) };
}

async function invoices() {
  const box = $("#invoices");
  let page;
  try {
    page = await api("GET", "/v1/invoices");
  } catch (e) {
    if (e.status === 404 || e.status === 501) {
      box.replaceChildren(el("p", { class: "empty" },
        "Invoices appear here once this tally-api serves GET /v1/invoices."));
      return;
    }
    throw e;
  }
  const rows = page.data || page.invoices || [];
  if (!rows.length) { box.replaceChildren(el("p", { class: "empty" }, "no invoices yet")); return; }
  const cols = Object.keys(rows[0]).filter((c) => typeof rows[0][c] !== "object" || rows[0][c] === null);
  const fmt = (c, v) => (/nanodollars$/.test(c) && typeof v === "number" ? money(v) : v ?? "");
  box.replaceChildren(el("table", {},
    el("thead", {}, el("tr", {}, ...cols.map((c) => el("th", {}, c.replace(/_nanodollars$/, ""))))),
    el("tbody", {}, ...rows.map((r) => el("tr", {}, ...cols.map((c) => el("td", {}, fmt(c, r[c]))))))));
}

// ---- wiring ----

$("#signin").addEventListener("submit", signIn);
$("#signout").addEventListener("click", signOut);
$("#refresh").addEventListener("click", () => refresh());
$("#live").addEventListener("change", schedule);
document.addEventListener("input", (ev) => { if (ev.target.name === "limit") ev.target.dataset.dirty = "1"; });
start();
