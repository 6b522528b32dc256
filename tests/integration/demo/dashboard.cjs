// The dashboard in a real browser (Debian's chromium, driven by puppeteer-core
// from web/package.json), against a running demo (test_demo.py starts it, with
// the trial key blocked at its limit and its sandbox paused). The browser runs
// in America/New_York, so a time drawn in the browser's zone instead of the
// stated one shows.
//  1. signs in through the page's form; a second tab is signed in by the same
//     session, without a form;
//  2. reads a key's spend on the page and checks it equals GET /v1/spend: the
//     spend only rises, so with /v1/spend read just before (a) and just after (b)
//     a refresh of the page, a <= page <= b, and page == a whenever a == b;
//  3. sets the key's daily limit and policy through the page's form and reads
//     them back from PostgreSQL (api_keys);
//  4. the charts: drawn, each with a table of its 12 hours, the hours and the
//     axis in UTC as stated;
//  5. the trial key's paused sandbox is listed under "Paused sandboxes" (never
//     under "Running sandboxes") with Resume disabled; raising the key's limit
//     in the page enables it, and Resume runs the sandbox again (GET /v1/sandboxes/{id});
//  6. adds a webhook destination to a receiver of this test's own, reads the
//     secret shown once, sends a test event from the page and sees it delivered
//     in the page's delivery history; the receiver's request carries the
//     event id shown and a Tally-Signature that verifies with the shown secret
//     (docs/alerts.md); Resend delivers the same event again;
//  7. downloads the current month's invoice CSV through the page's link: the
//     sum of its lines equals GET /v1/invoices/current's totals (nano-dollars
//     and cents);
//  8. at 390 px and at 1280 px: nothing lays out wider than the viewport or
//     spills out of its card, the charts stack at 390 px and stand side by side at
//     1280 px; every form control has a label; the "running"/"delivered" green
//     meets AA contrast (4.5:1); screenshots at both widths are written to
//     TALLY_ARTIFACTS (the test's log folder), the 1280 px one also to
//     TALLY_SCREENSHOT (docs/dashboard.png comes from there).
"use strict";
const path = require("path");
const fs = require("fs");
const http = require("http");
const crypto = require("crypto");
const { execFileSync } = require("child_process");
const puppeteer = require(path.join(process.env.TALLY_ROOT, "web", "node_modules", "puppeteer-core"));

const BASE = process.env.TALLY_URL, KEY = process.env.TALLY_KEY_ID, TRIAL = process.env.TALLY_TRIAL_KEY_ID;
const LIMIT_TEXT = "7.25", LIMIT_ND = 7250000000, POLICY = "stop";
const ARTIFACTS = process.env.TALLY_ARTIFACTS || fs.mkdtempSync("/tmp/tally-dashboard-");

function check(ok, msg) {
  if (!ok) throw new Error(msg);
  console.log("ok:", msg);
}

function sql(query) {
  return execFileSync("psql", ["-X", "-tA", "-d", process.env.TALLY_DATABASE_URL, "-c", query], { encoding: "utf8" }).trim();
}

// The webhook receiver: every request's headers and raw body, answered 200.
function receiver() {
  const got = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      got.push({ headers: req.headers, body: Buffer.concat(chunks) });
      res.writeHead(200, { "Content-Type": "text/plain" });
      res.end("ok");
    });
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve({ server, got, port: server.address().port })));
}

// RFC 4180 text → rows of fields.
function parseCsv(text) {
  const rows = [];
  let row = [], field = "", quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; } else if (c === '"') quoted = false; else field += c;
    } else if (c === '"') quoted = true;
    else if (c === ",") { row.push(field); field = ""; }
    else if (c === "\n" || c === "\r") {
      if (c === "\r" && text[i + 1] === "\n") i++;
      row.push(field); rows.push(row); row = []; field = "";
    } else field += c;
  }
  if (field !== "" || row.length) { row.push(field); rows.push(row); }
  return rows;
}

// WCAG 2 contrast ratio of two "rgb(r, g, b)" colours.
function contrast(a, b) {
  const lum = (s) => {
    const [r, g, bl] = s.match(/\d+(\.\d+)?/g).slice(0, 3).map(Number).map((v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * bl;
  };
  const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
  return (x + 0.05) / (y + 0.05);
}

// A refresh begun after this call, ended: one already in flight read what it shows
// before the call, so waiting for any refresh to end could show older figures.
async function refreshed(page) {
  const n = await page.$eval("body", (b) => Number(b.dataset.refreshStarted || 0));
  await page.click("#refresh");
  await page.waitForFunction((m) => Number(document.body.dataset.refreshed || 0) > m, { timeout: 30000 }, n);
}

async function layout(page, width) {
  await page.setViewport({ width, height: width < 600 ? 844 : 1000 });
  await new Promise((r) => setTimeout(r, 500)); // the charts redraw 200 ms after a resize
  await refreshed(page);
  await page.waitForFunction((w) => {
    const c = document.querySelector("#chart-meter canvas");
    return c && c.getBoundingClientRect().width <= w;
  }, { timeout: 20000 }, width);
  const m = await page.evaluate(() => {
    const spill = [...document.querySelectorAll("section, .card")].filter((e) => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
      .map((e) => `${e.id || e.className || e.tagName} ${e.scrollWidth}>${e.clientWidth}`);
    const a = document.querySelector("#chart-meter").closest(".card").getBoundingClientRect();
    const b = document.querySelector("#chart-label").closest(".card").getBoundingClientRect();
    return { doc: document.documentElement.scrollWidth, body: document.body.scrollWidth, inner: window.innerWidth, spill,
             stacked: b.top >= a.bottom, side: Math.abs(a.top - b.top) < 2 && b.left >= a.right };
  });
  check(m.doc <= m.inner && m.body <= m.inner, `at ${width} px the page lays out at ${m.doc} px, within the viewport (${m.inner} px)`);
  check(m.spill.length === 0, `at ${width} px nothing spills out of its card: ${m.spill.join("; ")}`);
  if (width < 600) check(m.stacked, `at ${width} px the charts stack`);
  else check(m.side, `at ${width} px the charts stand side by side`);
  const file = path.join(ARTIFACTS, `dashboard-${width}.png`);
  await page.screenshot({ path: file, fullPage: true });
  console.log("screenshot:", file);
  return file;
}

(async () => {
  const hook = await receiver();
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    defaultViewport: { width: 1280, height: 1000 },
  });
  try {
    const page = await browser.newPage();
    await page.emulateTimezone("America/New_York");
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    // A failed request shows in the console too: those are checked by status below instead.
    page.on("console", (m) => { if (m.type() === "error" && !/Failed to load resource/.test(m.text())) errors.push(m.text()); });
    // Every answer under 400, except "who am I" before signing in (401).
    page.on("response", (r) => {
      const u = new globalThis.URL(r.url());
      const expected = u.pathname === "/v1/sessions/current" && r.status() === 401;
      if (r.status() >= 400 && !expected) errors.push(`${r.status()} ${u.pathname}`);
    });

    await page.goto(BASE + "/", { waitUntil: "networkidle0" });
    await page.type("#signin input[name=email]", process.env.TALLY_EMAIL);
    await page.type("#signin input[name=password]", process.env.TALLY_PASSWORD);
    await page.click("#signin button[type=submit]");
    const cell = `#spend tr[data-key="${KEY}"] td.spend`;
    await page.waitForSelector(cell, { timeout: 20000 });
    check(await page.$eval("#app", (e) => !e.hidden), "signed in through the form: the dashboard shows");

    // One session across tabs.
    const tab2 = await browser.newPage();
    await tab2.goto(BASE + "/", { waitUntil: "networkidle0" });
    await tab2.waitForFunction(() => !document.querySelector("#app").hidden && document.querySelector("#signin-section").hidden,
      { timeout: 20000 }).catch(() => {});
    check(await tab2.$eval("#app", (e) => !e.hidden), "a second tab shows the dashboard without asking to sign in");
    await tab2.close();

    // Live refresh off while comparing, so the page changes only when we say.
    await page.click("#live");
    const apiSpend = () => page.evaluate(async (key) => {
      const r = await fetch("/v1/spend?limit=1000", { credentials: "same-origin" });
      const row = (await r.json()).data.find((d) => d.key === key);
      return row.spend_nanodollars;
    }, KEY);
    let equal = false;
    for (let i = 0; i < 40 && !equal; i++) {
      const a = await apiSpend();
      await refreshed(page);
      const shown = Number(await page.$eval(cell, (td) => td.dataset.nanodollars));
      const text = await page.$eval(cell, (td) => td.textContent);
      const b = await apiSpend();
      if (!(a <= shown && shown <= b)) throw new Error(`page spend ${shown} outside /v1/spend ${a}..${b}`);
      if (a === b) {
        check(shown === a, `the page shows key ${KEY}'s spend ${shown} nano-dollars (${text}), /v1/spend says ${a}`);
        equal = true;
      }
    }
    check(equal, "/v1/spend held still across one page refresh at least once in 40 tries");

    // The limit form (limit and policy) → PUT /v1/keys/{id}/limit → PostgreSQL.
    const setLimit = async (key, text, policy) => {
      const form = `form.limit[data-key="${key}"]`;
      await page.$eval(`${form} input[name=limit]`, (e) => { e.value = ""; });
      await page.type(`${form} input[name=limit]`, text);
      if (policy) await page.select(`${form} select[name=policy]`, policy);
      await page.$eval("#limit-message", (m) => { delete m.dataset.saved; });
      await page.click(`${form} button[type=submit]`);
      await page.waitForFunction((k) => document.querySelector("#limit-message").dataset.saved === k, { timeout: 20000 }, key);
    };
    await setLimit(KEY, LIMIT_TEXT, POLICY);
    const stored = sql(`SELECT daily_limit_nanodollars || ' ' || limit_policy FROM api_keys WHERE id = '${KEY}'`);
    check(stored === `${LIMIT_ND} ${POLICY}`, `the form set the limit and policy: api_keys says ${stored}`);
    const shownLimit = await page.$eval(`#spend tr[data-key="${KEY}"] td.limit`, (td) => [td.dataset.nanodollars, td.dataset.policy]);
    check(shownLimit[0] === String(LIMIT_ND) && shownLimit[1] === POLICY, "the table shows the new limit and policy");

    // Charts, their tables, and the zone they are drawn in.
    await page.waitForSelector("#chart-meter canvas", { timeout: 20000 });
    await page.waitForSelector("#chart-label canvas", { timeout: 20000 });
    check(true, "both usage charts are drawn");
    const tables = await page.evaluate(() => ["meter", "label"].map((n) =>
      [...document.querySelectorAll(`#table-${n} tbody tr`)].map((tr) => [tr.dataset.hour, tr.querySelector("th").textContent])));
    check(tables.every((t) => t.length === 12), `each chart has a table of its 12 hours (${tables.map((t) => t.length)})`);
    const utc = (iso) => iso.slice(0, 10) + " " + iso.slice(11, 16);
    check(tables[0].every(([iso, shown]) => shown === utc(iso)),
      `the tables' hours are UTC as stated, in a browser in New York (${tables[0][0][1]} for ${tables[0][0][0]})`);
    // What uPlot drew on the time axis: the labels and the instants they stand at (its
    // axes' _values and _splits; the page keeps its charts in the global `charts`).
    const axis = await page.evaluate(() => ({ labels: charts.meter.plot.axes[0]._values, at: charts.meter.plot.axes[0]._splits }));
    const want = axis.at.map((s) => new Date(s * 1000).toISOString().slice(11, 16));
    check(axis.labels.length > 0 && JSON.stringify(axis.labels) === JSON.stringify(want),
      `the chart's time axis is drawn in UTC: ${axis.labels.join(" ")} at ${want.join(" ")} UTC`);
    const note = await page.$eval("#zone-note", (e) => e.textContent);
    check(/UTC/.test(note), `the page says which zone its times are in: "${note}"`);

    // Running and paused sandboxes; raise the trial key's limit, then Resume.
    const listed = async (state) => page.evaluate(async (s) =>
      (await (await fetch(`/v1/sandboxes?state=${s}&limit=1000`, { credentials: "same-origin" })).json())
        .sandboxes.map((x) => x.id).sort(), state);
    await refreshed(page);
    const running = await listed("running");
    const shownRunning = await page.$$eval("#sandboxes tr[data-sandbox]", (trs) => trs.map((t) => t.dataset.sandbox).sort());
    const costs = await page.$$eval("#sandboxes td.cost", (tds) => tds.map((t) => Number(t.dataset.nanodollars)));
    check(running.length > 0 && shownRunning.every((id) => running.includes(id)) && costs.every((c) => c > 0),
      `"Running sandboxes" lists running ones only (${shownRunning.length}), with their cost so far: ${costs}`);
    const trialPaused = await page.evaluate(async (key) =>
      (await (await fetch("/v1/sandboxes?state=paused&limit=1000", { credentials: "same-origin" })).json())
        .sandboxes.filter((s) => s.key === key).map((s) => s.id), TRIAL);
    check(trialPaused.length > 0, `the trial key has a paused sandbox (${trialPaused})`);
    const sid = trialPaused[0];
    const row = `#paused tr[data-sandbox="${sid}"]`;
    await page.waitForSelector(row, { timeout: 20000 });
    check(!shownRunning.includes(sid), `the paused sandbox ${sid} is not under "Running sandboxes"`);
    check(await page.$eval(`${row} button.resume`, (b) => b.disabled), "its Resume is disabled while its key is blocked");
    const trialSpend = await page.evaluate(async (key) =>
      (await (await fetch("/v1/spend?limit=1000", { credentials: "same-origin" })).json()).data.find((d) => d.key === key), TRIAL);
    check(trialSpend.blocked, "the trial key is blocked today");
    await setLimit(TRIAL, "5", "pause");
    await page.waitForFunction((r) => { const b = document.querySelector(`${r} button.resume`); return b && !b.disabled; },
      { timeout: 20000 }, row);
    check(true, "raising the trial key's limit in the page enables Resume");
    await page.click(`${row} button.resume`);
    await page.waitForFunction((id) => document.querySelector("#sandbox-message").dataset.resumed === id, { timeout: 30000 }, sid);
    const st = await page.evaluate(async (id) => (await (await fetch(`/v1/sandboxes/${id}`, { credentials: "same-origin" })).json()).state, sid);
    check(st === "running", `Resume ran the sandbox again: GET /v1/sandboxes/${sid} says ${st}`);
    await page.waitForSelector(`#sandboxes tr[data-sandbox="${sid}"]`, { timeout: 20000 });
    check(!(await page.$(row)), "it moved from the paused list to the running one");

    // A webhook destination, its secret shown once, a test event delivered, resent.
    await page.click("#live"); // live again: the delivery history follows the notifier
    const url = `http://127.0.0.1:${hook.port}/tally-hook`;
    await page.select("#dest-add select[name=kind]", "webhook");
    await page.type("#dest-add input[name=address]", url);
    await page.click("#dest-add button[type=submit]");
    await page.waitForFunction(() => document.querySelector("#dest-message").dataset.added, { timeout: 20000 });
    const dest = await page.$eval("#dest-message", (m) => m.dataset.added);
    const secret = await page.$eval("#dest-secret code.value", (c) => c.textContent);
    check(/^whsec_[0-9a-f]{64}$/.test(secret), `the webhook ${dest} was added and its secret shown (${secret.slice(0, 10)}…)`);
    await page.click(`#destinations tr[data-destination="${dest}"] button.test`);
    await page.waitForFunction(() => document.querySelector("#dest-message").dataset.tested, { timeout: 20000 });
    const delivered = async (n) => {
      await page.waitForFunction((d, k) => [...document.querySelectorAll("#deliveries tr[data-delivery]")]
        .filter((tr) => tr.querySelector("code")?.textContent === d && tr.dataset.state === "delivered").length >= k,
      { timeout: 60000 }, dest, n);
      return page.$$eval("#deliveries tr[data-delivery]", (trs, d) => trs.filter((tr) => tr.querySelector("code")?.textContent === d)
        .map((tr) => ({ id: tr.dataset.delivery, event: tr.dataset.event, state: tr.dataset.state })), dest);
    };
    let rows = await delivered(1);
    const test = rows.find((r) => r.state === "delivered");
    const req = hook.got.find((g) => g.headers["tally-event-id"] === test.event);
    check(!!req, `the delivery history shows delivery ${test.id} delivered, and the receiver got event ${test.event}`);
    const [, t, v1] = /^t=(\d+),v1=([0-9a-f]{64})$/.exec(req.headers["tally-signature"] || "") || [];
    const mac = crypto.createHmac("sha256", secret).update(Buffer.concat([Buffer.from(t + "."), req.body])).digest("hex");
    check(t && mac === v1, "its Tally-Signature verifies with the secret the page showed");
    await page.click(`#deliveries tr[data-delivery="${test.id}"] button.resend`);
    await page.waitForFunction(() => document.querySelector("#dest-message").dataset.resent, { timeout: 20000 });
    rows = await delivered(2);
    const again = hook.got.filter((g) => g.headers["tally-event-id"] === test.event).length;
    check(rows.filter((r) => r.event === test.event && r.state === "delivered").length >= 2 && again >= 2,
      `Resend delivered event ${test.event} again (${again} requests received)`);
    await page.click("#dest-secret button");
    await page.reload({ waitUntil: "networkidle0" });
    await page.waitForSelector(`#destinations tr[data-destination="${dest}"]`, { timeout: 20000 });
    check(!(await page.content()).includes(secret), "after a reload the secret is nowhere on the page");

    // The current month's invoice CSV through the page's link, against /v1/invoices/current.
    const dl = fs.mkdtempSync(path.join(ARTIFACTS, "download-"));
    const cdp = await page.createCDPSession();
    await cdp.send("Browser.setDownloadBehavior", { behavior: "allow", downloadPath: dl, eventsEnabled: true });
    await page.waitForSelector("#invoice-current a.csv", { timeout: 20000 });
    const invoiceApi = () => page.evaluate(async () => {
      const j = await (await fetch("/v1/invoices/current", { credentials: "same-origin" })).json();
      return [j.total_nanodollars, j.total_cents, j.month];
    });
    let matched = false;
    for (let i = 0; i < 30 && !matched; i++) {
      for (const f of fs.readdirSync(dl)) fs.unlinkSync(path.join(dl, f));
      const a = await invoiceApi();
      const done = new Promise((resolve) => {
        const on = (e) => { if (e.state === "completed" || e.state === "canceled") { cdp.off("Browser.downloadProgress", on); resolve(e.state); } };
        cdp.on("Browser.downloadProgress", on);
      });
      await page.click("#invoice-current a.csv");
      check((await done) === "completed", "the invoice CSV downloaded");
      const b = await invoiceApi();
      const file = fs.readdirSync(dl).find((f) => f.endsWith(".csv"));
      const csv = parseCsv(fs.readFileSync(path.join(dl, file), "utf8"));
      const head = csv[0], nd = head.indexOf("amount_nanodollars"), ct = head.indexOf("amount_cents");
      const lines = csv.slice(1).filter((r) => r.length === head.length);
      const sumNd = lines.reduce((s, r) => s + BigInt(r[nd]), 0n), sumCt = lines.reduce((s, r) => s + BigInt(r[ct]), 0n);
      if (a[0] === b[0] && a[1] === b[1]) {
        check(sumNd === BigInt(a[0]) && sumCt === BigInt(a[1]) && lines.every((r) => r[0] === a[2]),
          `the downloaded ${file} (${lines.length} lines of ${a[2]}) totals ${sumNd} nano-dollars, ${sumCt} cents; ` +
          `GET /v1/invoices/current says ${a[0]}, ${a[1]}`);
        fs.copyFileSync(path.join(dl, file), path.join(ARTIFACTS, file));
        matched = true;
      }
    }
    check(matched, "the invoice total held still across one download at least once in 30 tries");
    fs.rmSync(dl, { recursive: true, force: true });

    // Labels, contrast, and the layout at both widths.
    const unlabelled = await page.$$eval("#app input, #app select, #app textarea",
      (es) => es.filter((e) => !(e.labels && e.labels.length) && !e.getAttribute("aria-label")).map((e) => e.name || e.outerHTML));
    check(unlabelled.length === 0, `every form control has a label: ${unlabelled.join(", ")}`);
    const colours = await page.evaluate(() => {
      const probe = document.createElement("span");
      probe.className = "state-running";
      probe.textContent = "running";
      const host = document.querySelector("#sandboxes");
      host.parentElement.append(probe);
      const fg = getComputedStyle(probe).color, bg = getComputedStyle(host.closest("section")).backgroundColor;
      probe.remove();
      return [fg, bg === "rgba(0, 0, 0, 0)" ? "rgb(255, 255, 255)" : bg];
    });
    const ratio = contrast(colours[0], colours[1]);
    check(ratio >= 4.5, `the "running" green ${colours[0]} on ${colours[1]} has contrast ${ratio.toFixed(2)}:1 (AA: 4.5)`);
    await layout(page, 390);
    const wide = await layout(page, 1280);
    check(errors.length === 0, "no error in the page's console: " + errors.join("; "));
    if (process.env.TALLY_SCREENSHOT) {
      fs.copyFileSync(wide, process.env.TALLY_SCREENSHOT);
      console.log("screenshot:", process.env.TALLY_SCREENSHOT);
    }
  } finally {
    await browser.close();
    hook.server.close();
  }
})().catch((e) => {
  console.error("FAIL:", e.message);
  process.exit(1);
});
