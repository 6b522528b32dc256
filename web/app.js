// tally's billing dashboard. It reads and writes tally only through the public
// /v1 API, with the person's session cookie and the CSRF token sign-in returns
// (docs/api.md). Money arrives as integer nano-dollars (or cents on invoices)
// and is formatted with integer arithmetic (exact below 2^53 nano-dollars,
// $9 million); only the charts' y coordinates are plotted as floating point.
// Every chart has a table of its values beside it; every time is shown in one
// zone, displayZone(), and says which.
"use strict";

const REFRESH_MS = 5000;
const $ = (sel, root = document) => root.querySelector(sel);
// The CSRF token lives in localStorage, not sessionStorage, so that every tab of
// this origin shares the one session: a second tab does not ask to sign in
// again while the session is valid. The cookie itself is HttpOnly.
const CSRF_KEY = "tally_csrf";
let csrf = localStorage.getItem(CSRF_KEY) || "";
let timer = null;
let signedIn = false;
const charts = {};
const keyNames = new Map(); // key id → name, from /v1/spend
const keyState = new Map(); // key id → its /v1/spend row

// ---- time: one zone for everything the page shows ----

// The zone the dashboard shows times and days in: the account's (its days of
// spend, limits, alerts and invoices are days there; GET /v1/account/settings
// names it, UTC by default), and the page says which.
let accountZone = "UTC";
function displayZone() {
  return accountZone;
}
async function loadZone() {
  const s = await api("GET", "/v1/account/settings").catch(() => null);
  if (s && typeof s.time_zone === "string" && s.time_zone) accountZone = s.time_zone;
}

const formatters = new Map();
function zoneParts(ms) {
  const zone = displayZone();
  let f = formatters.get(zone);
  if (!f) {
    f = new Intl.DateTimeFormat("en-US", {
      timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit",
    });
    formatters.set(zone, f);
  }
  const p = {};
  for (const x of f.formatToParts(new Date(ms))) p[x.type] = x.value;
  return p;
}

// An instant (ms, or an RFC 3339 string) → "2026-12-03 18:05" in displayZone().
function fmtTime(t, seconds = false) {
  if (t === null || t === undefined || t === "") return "—";
  const ms = typeof t === "number" ? t : Date.parse(t);
  if (Number.isNaN(ms)) return String(t);
  const p = zoneParts(ms);
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}` + (seconds ? `:${p.second}` : "");
}
function fmtHour(ms) {
  const p = zoneParts(ms);
  return `${p.hour}:${p.minute}`;
}

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
  const micro = Math.floor((Math.abs(nd) + 500) / 1000);
  const whole = Math.floor(micro / 1000000);
  const frac = String(micro % 1000000).padStart(6, "0");
  return (neg ? "-$" : "$") + whole.toLocaleString("en-US") + "." + frac;
}

// cents → "$12.34" (invoices are billed in cents).
function cents(c) {
  if (c === null || c === undefined) return "—";
  const neg = c < 0, a = Math.abs(c);
  return (neg ? "-$" : "$") + Math.floor(a / 100).toLocaleString("en-US") + "." + String(a % 100).padStart(2, "0");
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
    if (v === undefined) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role" || k === "scope") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// Each cell of a reflowing table carries its column's name (app.css shows it on
// narrow screens, where the head is hidden).
function labelCells(table) {
  const heads = [...table.querySelectorAll("thead th")].map((th) => th.textContent);
  for (const tr of table.querySelectorAll("tbody tr"))
    [...tr.children].forEach((td, i) => { if (heads[i] && !td.dataset.label) td.dataset.label = heads[i]; });
}

function setRows(tbody, rows, cols, none = "none") {
  tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colSpan: cols }, none))]));
  labelCells(tbody.closest("table"));
}

function say(sel, text, data) {
  const m = $(sel);
  m.textContent = text;
  for (const [k, v] of Object.entries(data || {})) m.dataset[k] = v;
}

// ---- sign-in, one session for every tab ----

async function signIn(ev) {
  ev.preventDefault();
  const f = ev.target;
  $("#signin-error").textContent = "";
  try {
    const s = await api("POST", "/v1/sessions", { email: f.email.value, password: f.password.value });
    csrf = s.csrf_token;
    localStorage.setItem(CSRF_KEY, csrf);
    f.password.value = "";
    await start();
  } catch (e) {
    $("#signin-error").textContent = e.status === 401 ? "Wrong email or password." : e.message;
  }
}

async function signOut() {
  try { await api("DELETE", "/v1/sessions/current"); } catch (e) { /* already gone */ }
  csrf = "";
  localStorage.removeItem(CSRF_KEY);
  showSignIn();
}

function showSignIn() {
  clearInterval(timer);
  signedIn = false;
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
  csrf = localStorage.getItem(CSRF_KEY) || csrf;
  if (!csrf) { showSignIn(); return; } // a session without its token anywhere: sign in again
  signedIn = true;
  $("#who").textContent = `${me.email || me.person} · account ${me.account}`;
  $("#signin-section").hidden = true;
  $("#app").hidden = false;
  $("#signout").hidden = false;
  $("#refresh").hidden = false;
  await loadZone();
  const zone = displayZone();
  $("#zone-note").textContent = `Times and days are shown in ${zone}, the account's time zone: ` +
    "its days are the days of spend, limits and invoices.";
  for (const e of document.querySelectorAll(".zone-label")) e.textContent = `(last 12 hours, ${zone})`;
  await refresh();
  schedule();
}

// Another tab signed in or out: follow it.
window.addEventListener("storage", (ev) => {
  if (ev.key !== CSRF_KEY) return;
  csrf = ev.newValue || "";
  if (!csrf) showSignIn();
  else if (!signedIn) start();
});

function schedule() {
  clearInterval(timer);
  if ($("#live").checked) timer = setInterval(() => refresh(true), REFRESH_MS);
}

// ---- the sections ----

// One refresh at a time; asked while one runs, it runs again after it, so what a
// click (or the timer) shows was read after the click, never before.
// The invoices change slowly and cost the database most: the timer reads them
// every INVOICES_MS, a click on Refresh (or a change made here) every time.
// Each refresh is numbered as it starts (body's data-refresh-started) and the page
// says the number of the last one that finished (data-refreshed): a reader that
// wants a refresh begun after some moment waits for a number above the one started
// then, not for any refresh to end (one in flight read what it shows before).
const INVOICES_MS = 30000;
let refreshing = null, invoicesAt = 0, refreshSeq = 0;
async function refresh(auto = false) {
  while (refreshing) await refreshing;
  refreshing = (async () => {
    const seq = ++refreshSeq;
    document.body.dataset.refreshStarted = String(seq);
    try {
      await spend(); // first: the other sections name keys by the names it reads
      const inv = !auto || Date.now() - invoicesAt >= INVOICES_MS;
      if (inv) invoicesAt = Date.now();
      await Promise.all([sandboxes(), alerts(), usage(), destinations(), deliveries(), inv ? invoices() : null]);
      document.body.dataset.refreshed = String(seq);
    } catch (e) {
      if (e.status === 401) { showSignIn(); return; }
      $("#asof").textContent = "refresh failed: " + e.message;
    }
  })();
  try { await refreshing; } finally { refreshing = null; }
}

// A key's caps (GET /v1/keys), as " · at most 3 sandboxes, 2048 MiB"; "" when none.
function capsText(k) {
  const caps = [];
  if (k.max_sandboxes !== null && k.max_sandboxes !== undefined) caps.push(`${k.max_sandboxes} sandboxes`);
  if (k.max_memory_mib !== null && k.max_memory_mib !== undefined) caps.push(`${k.max_memory_mib} MiB`);
  return caps.length ? " · at most " + caps.join(", ") : "";
}

async function spend() {
  const rows = [];
  let cursor = null, first = null;
  const [keys] = await Promise.all([all("/v1/keys", "keys").catch(() => []), (async () => {
    do {
      const page = await api("GET", "/v1/spend?limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
      first = first || page;
      rows.push(...page.data);
      cursor = page.next_cursor;
    } while (cursor);
  })()]);
  const keyInfo = new Map(keys.map((k) => [k.id, k]));
  $("#day").textContent = `(day ${first.day}, ${displayZone()})`;
  $("#asof").textContent = "as of " + fmtTime(first.as_of, true) + " " + displayZone();
  $("#asof").dataset.asOf = first.as_of;
  const tbody = $("#spend tbody");
  const keep = new Set();
  for (const k of rows) {
    if (k.revoked) continue;
    keep.add(k.key);
    keyNames.set(k.key, k.name || k.key);
    keyState.set(k.key, k);
    let tr = tbody.querySelector(`tr[data-key="${CSS.escape(k.key)}"]`);
    if (!tr) {
      tr = el("tr", { "data-key": k.key });
      for (let i = 0; i < 6; i++) tr.append(el("td"));
      const policy = el("select", { name: "policy" },
        ...["pause", "stop", "alert_only"].map((p) => el("option", { value: p }, p.replace("_", " "))));
      const form = el("form", { class: "limit", "data-key": k.key, "aria-label": `daily limit of ${k.name || k.key}` },
        el("label", {}, "Daily limit (USD)",
          el("input", { name: "limit", placeholder: "no limit", inputMode: "decimal", autocomplete: "off" })),
        el("label", {}, "Policy", policy),
        el("button", { type: "submit" }, "Save"));
      form.addEventListener("submit", setLimit);
      tr.append(el("td", {}, form));
      tbody.querySelector("td.empty")?.parentElement.remove();
      tbody.append(tr);
    }
    const [name, spendTd, limitTd, barTd, burnTd, stateTd] = tr.children;
    const info = keyInfo.get(k.key);
    name.replaceChildren(el("strong", {}, k.name || k.key), " ", el("span", { class: "muted" }, k.key +
      (info && info.internet ? " · internet on" : "") + (info ? capsText(info) : "")));
    spendTd.className = "num spend";
    spendTd.dataset.nanodollars = String(k.spend_nanodollars);
    spendTd.textContent = money(k.spend_nanodollars);
    limitTd.className = "num limit";
    limitTd.dataset.nanodollars = k.limit_nanodollars === null ? "" : String(k.limit_nanodollars);
    limitTd.dataset.policy = k.limit_policy || "";
    limitTd.textContent = k.limit_nanodollars === null ? "none" : money(k.limit_nanodollars) + " " + (k.limit_policy || "").replace("_", " ");
    if (k.limit_nanodollars) {
      const pct = Math.min(100, Math.floor(k.spend_nanodollars * 100 / k.limit_nanodollars));
      const bar = el("span", { class: "bar" + (pct >= 100 ? " bad" : pct >= 80 ? " warn" : ""), "aria-hidden": "true" }, el("span"));
      bar.firstChild.style.width = pct + "%";
      barTd.replaceChildren(bar, ` ${pct}%`);
    } else {
      barTd.replaceChildren(el("span", { class: "muted" }, "no limit"));
    }
    burnTd.className = "num";
    burnTd.textContent = money(k.burn_rate_nanodollars_per_hour) +
      (k.reaches_limit_at ? ` (limit at ${fmtHour(Date.parse(k.reaches_limit_at))} ${displayZone()})` : "");
    stateTd.className = k.blocked ? "state-blocked" : "";
    stateTd.textContent = k.blocked ? "blocked today" : k.limit_reached ? "limit reached" : "ok";
    const input = tr.querySelector("input[name=limit]"), select = tr.querySelector("select[name=policy]");
    if (document.activeElement !== input && !input.dataset.dirty) input.value = dollarsText(k.limit_nanodollars);
    if (document.activeElement !== select && !select.dataset.dirty) select.value = k.limit_policy || "pause";
  }
  for (const tr of [...tbody.querySelectorAll("tr[data-key]")]) if (!keep.has(tr.dataset.key)) tr.remove();
  if (!keep.size) setRows(tbody, [], 7);
  labelCells($("#spend"));
}

async function setLimit(ev) {
  ev.preventDefault();
  const form = ev.target, key = form.dataset.key, input = form.limit, policy = form.policy.value;
  try {
    let answer;
    if (input.value.trim() === "") {
      answer = await api("DELETE", `/v1/keys/${encodeURIComponent(key)}/limit`);
    } else {
      const nd = parseDollars(input.value);
      if (nd === null) { say("#limit-message", "A limit is dollars, e.g. 0.50 (up to 9 decimals)."); return; }
      answer = await api("PUT", `/v1/keys/${encodeURIComponent(key)}/limit`, { daily_limit_nanodollars: nd, policy });
    }
    delete input.dataset.dirty;
    delete form.policy.dataset.dirty;
    await refresh(); // the page shows the change once the message says it is saved
    say("#limit-message", `${keyNames.get(key) || key}: daily limit ${answer.daily_limit_nanodollars === null ? "removed"
      : "set to " + money(answer.daily_limit_nanodollars) + ", policy " + (answer.limit_policy || policy).replace("_", " ")}` +
      (answer.block_lifted ? " — the block is lifted: new sandboxes may start, and its paused sandboxes can be resumed below." : "."),
    { saved: key });
  } catch (e) {
    say("#limit-message", `${key}: ${e.message}`);
  }
}

async function sandboxList(state) {
  const list = await all(`/v1/sandboxes?state=${state}`, "sandboxes");
  return Promise.all(list.map((s) => api("GET", `/v1/sandboxes/${encodeURIComponent(s.id)}`).catch(() => s)));
}

function mib(bytes) {
  return bytes === undefined || bytes === null ? "" : `${Math.round(bytes / 1048576)} MiB`;
}

async function sandboxes() {
  const [running, paused] = await Promise.all([sandboxList("running"), sandboxList("paused")]);
  const common = (s) => [
    el("td", {}, el("code", {}, s.id)),
    el("td", { title: s.key || "" }, keyNames.get(s.key) || s.key || ""),
    el("td", {}, Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ")),
  ];
  const cost = (s) => el("td", { class: "num cost", "data-nanodollars": String(s.cost_nanodollars ?? "") }, money(s.cost_nanodollars));
  setRows($("#sandboxes tbody"), running.filter((s) => s.state === "running").map((s) => el("tr", { "data-sandbox": s.id },
    ...common(s),
    el("td", { class: "num" }, s.vcpus ?? ""),
    el("td", { class: "num" }, s.memory_mib ? `${s.memory_mib} MiB` : ""),
    // measured memory (now, and peak) when this tally-vmm reports it
    el("td", { class: "num" }, s.mem_bytes !== undefined ? mib(s.mem_bytes) + (s.mem_peak_bytes !== undefined ? ` (peak ${mib(s.mem_peak_bytes)})` : "") : "—"),
    cost(s))), 7, "no running sandbox");
  setRows($("#paused tbody"), paused.filter((s) => s.state === "paused").map((s) => {
    const k = keyState.get(s.key);
    const blocked = !!(k && k.blocked);
    const btn = el("button", { type: "button", class: "resume", "data-sandbox": s.id, disabled: blocked },
      "Resume");
    if (blocked) btn.setAttribute("aria-describedby", `why-${s.id}`);
    btn.addEventListener("click", () => resume(s.id, btn));
    return el("tr", { "data-sandbox": s.id, "data-blocked": String(blocked) },
      ...common(s),
      el("td", { class: "num" }, s.memory_mib ? `${s.memory_mib} MiB` : ""),
      cost(s),
      el("td", { id: `why-${s.id}` }, blocked ? "its key reached its daily limit: raise the limit to resume it"
        : k && k.limit_reached ? "its key is at its limit" : "paused"),
      el("td", { class: "actions" }, btn));
  }), 7, "no paused sandbox");
}

async function resume(id, btn) {
  btn.disabled = true;
  try {
    await api("POST", `/v1/sandboxes/${encodeURIComponent(id)}/resume`);
    await refresh();
    say("#sandbox-message", `${id} resumed.`, { resumed: id });
  } catch (e) {
    btn.disabled = false;
    say("#sandbox-message", `${id}: ${e.message}`);
    await refresh();
  }
}

async function alerts() {
  const page = await api("GET", "/v1/alerts?limit=20");
  const rows = page.data.map((a) => el("tr", {},
    el("td", {}, fmtTime(a.created_at)),
    el("td", { title: a.key }, keyNames.get(a.key) || a.key), el("td", {}, a.day),
    el("td", { class: "num" }, a.type === "spend.limit_projected"
      ? "projected by " + fmtTime(a.projected_at) : a.threshold_pct + "%"),
    el("td", { class: "num" }, money(a.spend_nanodollars)),
    el("td", { class: "num" }, money(a.limit_nanodollars)),
    el("td", { class: "state-" + a.state }, a.state === "delivered" ? "delivered " + fmtTime(a.delivered_at)
      : a.state === "no_destination" ? "no destination set (add one below)" : a.state)));
  setRows($("#alerts tbody"), rows, 7, "no alert yet");
}

// ---- alert destinations and their deliveries ----

async function destinations() {
  const { destinations: list } = await api("GET", "/v1/alert-destinations");
  const shown = list.filter((d) => d.enabled);
  setRows($("#destinations tbody"), shown.map((d) => {
    const test = el("button", { type: "button", class: "test" }, "Send test");
    test.addEventListener("click", () => destAction(d, "test", test));
    const off = el("button", { type: "button", class: "disable" }, "Disable");
    off.addEventListener("click", () => destAction(d, "disable", off));
    return el("tr", { "data-destination": d.id },
      el("td", {}, el("code", {}, d.id)), el("td", {}, d.kind), el("td", {}, d.url || d.email),
      el("td", {}, fmtTime(d.created_at)), el("td", { class: "actions" }, test, off));
  }), 5, "no destination: alerts are recorded but sent nowhere");
}

async function destAction(d, what, btn) {
  btn.disabled = true;
  let text, data;
  try {
    if (what === "test") {
      const q = await api("POST", `/v1/alert-destinations/${encodeURIComponent(d.id)}/test`);
      [text, data] = [`A test event is queued for ${d.url || d.email} (delivery ${q.delivery_id}).`, { tested: d.id }];
    } else {
      await api("DELETE", `/v1/alert-destinations/${encodeURIComponent(d.id)}`);
      text = `${d.url || d.email} disabled: it gets no more alerts.`;
    }
  } catch (e) {
    text = `${d.id}: ${e.message}`;
  }
  btn.disabled = false;
  await refresh();
  say("#dest-message", text, data);
}

function destKindChanged() {
  const f = $("#dest-add"), webhook = f.kind.value === "webhook";
  $("#dest-target-label").textContent = webhook ? "Webhook URL" : "Email address";
  f.address.type = webhook ? "url" : "email";
  f.address.placeholder = webhook ? "https://example.com/tally" : "billing@example.com";
}

async function addDestination(ev) {
  ev.preventDefault();
  const f = ev.target, kind = f.kind.value, target = f.address.value.trim();
  const box = $("#dest-secret");
  try {
    const d = await api("POST", "/v1/alert-destinations", kind === "webhook" ? { kind, url: target } : { kind, email: target });
    f.address.value = "";
    if (d.secret) {
      const dismiss = el("button", { type: "button" }, "I have saved it");
      dismiss.addEventListener("click", () => { box.hidden = true; box.replaceChildren(); });
      box.replaceChildren(
        el("p", {}, el("strong", {}, "Signing secret of this webhook, shown once: "), "copy it now, tally never shows it again."),
        el("p", {}, el("code", { class: "value", "data-destination": d.id }, d.secret)),
        el("p", { class: "muted" }, "Each request carries Tally-Signature: t=…,v1=HMAC-SHA256 of t.body with this secret (docs/alerts.md)."),
        dismiss);
      box.hidden = false;
      box.focus();
    }
    await refresh();
    say("#dest-message", `${kind} ${d.url || d.email} added (${d.id}).`, { added: d.id });
  } catch (e) {
    say("#dest-message", e.message);
  }
}

async function deliveries() {
  const page = await api("GET", "/v1/alert-deliveries?limit=30");
  const rows = page.data.map((d) => {
    const tr = el("tr", { "data-delivery": String(d.id), "data-event": d.event_id, "data-state": d.state },
      el("td", {}, fmtTime(d.created_at, true)),
      el("td", {}, el("code", {}, d.destination)),
      el("td", {}, d.type, " ", el("span", { class: "muted" }, d.event_id.slice(0, 8) + (d.resend_of ? ` · resend of ${d.resend_of}` : ""))),
      el("td", { class: "state-" + d.state }, d.state + (d.delivered_at ? " " + fmtTime(d.delivered_at, true) : "")),
      el("td", { class: "num" }, d.attempts),
      el("td", {}, d.last_error || ""));
    const act = el("td", { class: "actions" });
    if (d.state !== "pending" && d.destination_enabled !== false) {
      const b = el("button", { type: "button", class: "resend" }, "Resend");
      b.addEventListener("click", async () => {
        b.disabled = true;
        let text, data;
        try {
          const q = await api("POST", `/v1/alert-deliveries/${d.id}/resend`);
          [text, data] = [`Delivery ${d.id} resent as ${q.delivery_id} (the same event id).`, { resent: String(q.delivery_id) }];
        } catch (e) {
          text = `delivery ${d.id}: ${e.message}`;
        }
        await refresh();
        say("#dest-message", text, data);
      });
      act.append(b);
    }
    tr.append(act);
    return tr;
  });
  setRows($("#deliveries tbody"), rows, 7, "nothing sent yet");
}

// ---- charts, each with a table of its values ----

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

const COLORS = ["#1f5fcf", "#a35f00", "#1b6b3e", "#7d3c98", "#b3261e", "#117a65", "#5d6d7e"];

function draw(name, xs, rows, seriesOf) {
  const names = [...new Set(rows.map(seriesOf))].sort();
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = names.map(() => xs.map(() => 0));
  for (const r of rows) {
    const i = index.get(Date.parse(r.period_start) / 1000);
    if (i !== undefined) ys[names.indexOf(seriesOf(r))][i] += r.cost_nanodollars;
  }
  chartTable(name, xs, names, ys);
  // Plotted in dollars (display only: the figures in the tables are exact).
  const data = [xs, ...ys.map((s) => s.map((nd) => nd / 1e9))];
  const box = $("#chart-" + name);
  const sig = names.join("|") + "|" + displayZone();
  const width = Math.max(280, box.clientWidth);
  if (charts[name] && charts[name].sig === sig) {
    if (charts[name].width !== width) { charts[name].plot.setSize({ width, height: 240 }); charts[name].width = width; }
    charts[name].plot.setData(data);
    return;
  }
  if (charts[name]) charts[name].plot.destroy();
  box.replaceChildren();
  if (!names.length) { box.append(el("p", { class: "empty" }, "no usage in these hours yet")); delete charts[name]; return; }
  const zone = displayZone();
  const opts = {
    width, height: 240,
    // uPlot draws in the browser's zone unless told: every date it makes is in displayZone().
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), zone === "UTC" ? "Etc/UTC" : zone),
    series: [{ value: (u, v) => (v == null ? "—" : fmtTime(v * 1000) + " " + zone) }, ...names.map((n, i) => ({
      label: n, stroke: COLORS[i % COLORS.length], width: 2, fill: COLORS[i % COLORS.length] + "22",
      points: { show: true }, value: (u, v) => (v == null ? "—" : "$" + v.toFixed(6)),
    }))],
    axes: [{
      values: (u, splits) => {
        const labels = splits.map((s) => fmtHour(s * 1000));
        box.dataset.ticks = labels.join(" ");
        return labels;
      },
    }, { values: (u, vals) => vals.map((v) => "$" + v.toFixed(4)), size: 70 }],
    scales: { x: { time: true } },
  };
  charts[name] = { sig, width, plot: new uPlot(opts, data, box) };
}

// The chart's values, exact, as a table: one row per hour, one column per series.
function chartTable(name, xs, names, ys) {
  const box = $("#table-" + name);
  if (!names.length) { box.replaceChildren(el("p", { class: "empty" }, "no usage in these hours yet")); return; }
  const zone = displayZone();
  box.replaceChildren(el("table", { class: "values" },
    el("caption", { class: "sr-only" }, `cost per hour in ${zone}`),
    el("thead", {}, el("tr", {}, el("th", { scope: "col" }, `hour (${zone})`),
      ...names.map((n) => el("th", { scope: "col", class: "num" }, n)))),
    el("tbody", {}, ...xs.map((x, i) => el("tr", { "data-hour": new Date(x * 1000).toISOString() },
      el("th", { scope: "row" }, fmtTime(x * 1000)),
      ...names.map((n, s) => el("td", { class: "num", "data-nanodollars": String(ys[s][i]) }, money(ys[s][i]))))))));
}

// ---- invoices ----

function invoiceLines(inv) {
  const lines = inv.lines || [];
  if (!lines.length) return el("p", { class: "empty" }, "no lines yet");
  const rows = lines.map((l) => el("tr", { class: l.kind, "data-line": String(l.line_no) },
    el("td", {}, l.line_no),
    el("td", {}, l.kind === "credit" ? "free credit" : l.kind === "adjustment" ? `${l.meter} (late usage of ${l.for_month})` : l.meter),
    el("td", { class: "num" }, `${l.quantity} ${l.unit}`),
    el("td", { class: "num", "data-nanodollars": String(l.amount_nanodollars) }, money(l.amount_nanodollars)),
    el("td", { class: "num", "data-cents": String(l.amount_cents) }, cents(l.amount_cents))));
  rows.push(el("tr", { class: "total" }, el("td", {}), el("td", {}, "total"), el("td", {}),
    el("td", { class: "num", "data-nanodollars": String(inv.total_nanodollars) }, money(inv.total_nanodollars)),
    el("td", { class: "num", "data-cents": String(inv.total_cents) }, cents(inv.total_cents))));
  const t = el("table", { class: "reflow lines" },
    el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "line"), el("th", { scope: "col" }, "item"),
      el("th", { scope: "col", class: "num" }, "quantity"), el("th", { scope: "col", class: "num" }, "exact"),
      el("th", { scope: "col", class: "num" }, "billed"))),
    el("tbody", {}, ...rows));
  labelCells(t);
  return t;
}

function csvLink(month, label) {
  return el("a", { href: `/v1/invoices/${month}?csv=true`, download: `tally-invoice-${month}.csv`, class: "csv", "data-month": month }, label);
}

function creditText(inv) {
  const c = (inv.lines || []).filter((l) => l.kind === "credit");
  if (!c.length) return "no free credit on this invoice";
  const q = c.map((l) => `${l.quantity} ${l.unit}s`).join(", ");
  return `free credit ${cents(c.reduce((a, l) => a + l.amount_cents, 0))} (${q})`;
}

let invoicesShown = "";
async function invoices() {
  const [cur, list] = await Promise.all([api("GET", "/v1/invoices/current"), api("GET", "/v1/invoices")]);
  const proj = cur.projection;
  const box = $("#invoice-current");
  box.dataset.month = cur.month;
  box.dataset.totalCents = String(cur.total_cents);
  box.dataset.totalNanodollars = String(cur.total_nanodollars);
  box.replaceChildren(
    el("div", { class: "invoice-head" },
      el("h3", {}, `This month, ${cur.month} (preview)`),
      el("span", { class: "total" }, cents(cur.total_cents)),
      el("span", { class: "muted" }, `so far (${money(cur.total_nanodollars)} exact); ${creditText(cur)}`),
      proj ? el("span", { class: "muted" }, `end of month at this rate: ${cents(proj.total_cents)}`) : null,
      csvLink(cur.month, "Download CSV")),
    invoiceLines(cur));
  // Other months, newest first: the open ones as previews, the closed ones as billed.
  const months = (list.data || []).filter((i) => !(i.month === cur.month && i.status !== "closed") && i.status !== "estimate");
  const sig = JSON.stringify(months.map((i) => [i.month, i.status, i.total_cents]));
  if (sig === invoicesShown) return;
  invoicesShown = sig;
  const out = $("#invoices");
  if (!months.length) { out.replaceChildren(el("p", { class: "empty" }, "no other invoice yet: months close after they end")); return; }
  out.replaceChildren(...months.map((i) => {
    const d = el("details", { class: "invoice", "data-month": i.month },
      el("summary", {}, `${i.month} · ${i.status === "closed" ? "closed " + fmtTime(i.closed_at) : "open (preview)"} · ${cents(i.total_cents)} · ${i.line_count} lines`));
    const body = el("div", {}, el("p", { class: "muted" }, "loading…"));
    d.append(body, el("p", {}, csvLink(i.month, `Download ${i.month} CSV`)));
    d.addEventListener("toggle", async () => {
      if (!d.open || d.dataset.loaded) return;
      try {
        const inv = await api("GET", `/v1/invoices/${i.month}`);
        body.replaceChildren(el("p", { class: "muted" }, creditText(inv)), invoiceLines(inv));
        d.dataset.loaded = "1";
      } catch (e) {
        body.replaceChildren(el("p", { class: "error" }, e.message));
      }
    });
    return d;
  }));
}

// ---- wiring ----

$("#signin").addEventListener("submit", signIn);
$("#signout").addEventListener("click", signOut);
$("#refresh").addEventListener("click", () => refresh());
$("#live").addEventListener("change", schedule);
$("#dest-add").addEventListener("submit", addDestination);
$("#dest-add").kind.addEventListener("change", destKindChanged);
document.addEventListener("input", (ev) => { if (ev.target.name === "limit") ev.target.dataset.dirty = "1"; });
document.addEventListener("change", (ev) => { if (ev.target.name === "policy") ev.target.dataset.dirty = "1"; });
let resizeTimer = null;
window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(() => { if (signedIn) usage().catch(() => {}); }, 200); });
start();
