// The dashboard in a real browser (Debian's chromium, driven by puppeteer-core
// from web/package.json), against a running demo (test_demo.py starts it):
//  1. signs in with the printed email and password through the page's form;
//  2. reads a key's spend on the page and checks it equals GET /v1/spend: the
//     spend only rises, so with /v1/spend read just before (a) and just after (b)
//     a refresh of the page, a <= page <= b, and page == a whenever a == b;
//  3. sets the key's daily limit through the page's form and reads it back from
//     PostgreSQL (api_keys.daily_limit_nanodollars);
//  4. sees charts drawn and the running sandboxes with their cost, and saves a
//     screenshot (TALLY_SCREENSHOT; docs/dashboard.png comes from here).
"use strict";
const path = require("path");
const { execFileSync } = require("child_process");
const puppeteer = require(path.join(process.env.TALLY_ROOT, "web", "node_modules", "puppeteer-core"));

const BASE = process.env.TALLY_URL, KEY = process.env.TALLY_KEY_ID;
const LIMIT_TEXT = "7.25", LIMIT_ND = 7250000000;

function check(ok, msg) {
  if (!ok) throw new Error(msg);
  console.log("ok:", msg);
}

function sql(query) {
  return execFileSync("psql", ["-X", "-tA", "-d", process.env.TALLY_DATABASE_URL, "-c", query], { encoding: "utf8" }).trim();
}

(async () => {
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
    defaultViewport: { width: 1280, height: 1000 },
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    // A failed request shows in the console too: those are checked by status below instead.
    page.on("console", (m) => { if (m.type() === "error" && !/Failed to load resource/.test(m.text())) errors.push(m.text()); });
    // Every answer under 400, except the two the page expects: "who am I" before
    // signing in (401), and /v1/invoices on a tally-api that does not serve it yet (404).
    page.on("response", (r) => {
      const u = new globalThis.URL(r.url());
      const expected = (u.pathname === "/v1/sessions/current" && r.status() === 401) ||
        (u.pathname === "/v1/invoices" && r.status() === 404);
      if (r.status() >= 400 && !expected) errors.push(`${r.status()} ${u.pathname}`);
    });

    await page.goto(BASE + "/", { waitUntil: "networkidle0" });
    await page.type("#signin input[name=email]", process.env.TALLY_EMAIL);
    await page.type("#signin input[name=password]", process.env.TALLY_PASSWORD);
    await page.click("#signin button[type=submit]");
    const cell = `#spend tr[data-key="${KEY}"] td.spend`;
    await page.waitForSelector(cell, { timeout: 20000 });
    check(await page.$eval("#app", (e) => !e.hidden), "signed in through the form: the dashboard shows");

    // Live refresh off while comparing, so the page changes only when we say.
    await page.click("#live");
    const apiSpend = () => page.evaluate(async (key) => {
      const r = await fetch("/v1/spend?limit=1000", { credentials: "same-origin" });
      const row = (await r.json()).data.find((d) => d.key === key);
      return row.spend_nanodollars;
    }, KEY);
    let equal = false;
    for (let i = 0; i < 40 && !equal; i++) {
      const n = await page.$eval("body", (b) => Number(b.dataset.refreshed || 0));
      const a = await apiSpend();
      await page.click("#refresh");
      await page.waitForFunction((m) => Number(document.body.dataset.refreshed || 0) > m, { timeout: 20000 }, n);
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

    // The limit form → PUT /v1/keys/{id}/limit → PostgreSQL.
    const input = `form.limit[data-key="${KEY}"] input[name=limit]`;
    await page.click(input, { clickCount: 3 });
    await page.$eval(input, (e) => { e.value = ""; });
    await page.type(input, LIMIT_TEXT);
    await page.click(`form.limit[data-key="${KEY}"] button[type=submit]`);
    await page.waitForFunction((k) => document.querySelector("#limit-message").dataset.saved === k, { timeout: 20000 }, KEY);
    const stored = sql(`SELECT daily_limit_nanodollars FROM api_keys WHERE id = '${KEY}'`);
    check(stored === String(LIMIT_ND), `the form set the limit: api_keys.daily_limit_nanodollars = ${stored}`);
    const shownLimit = await page.$eval(`#spend tr[data-key="${KEY}"] td.limit`, (td) => td.dataset.nanodollars);
    check(shownLimit === String(LIMIT_ND), "the table shows the new limit");

    // Charts and sandboxes.
    await page.click("#live");
    await page.waitForSelector("#chart-meter canvas", { timeout: 20000 });
    check(true, "the usage chart by meter is drawn");
    await page.waitForSelector("#chart-label canvas", { timeout: 20000 });
    check(true, "the usage chart by label is drawn");
    const listed = await page.evaluate(async () =>
      (await (await fetch("/v1/sandboxes?state=running,paused&limit=1000", { credentials: "same-origin" })).json())
        .sandboxes.map((s) => s.id).sort());
    const shownIds = await page.$$eval("#sandboxes tr[data-sandbox]", (trs) => trs.map((t) => t.dataset.sandbox).sort());
    const costs = await page.$$eval("#sandboxes td.cost", (tds) => tds.map((t) => Number(t.dataset.nanodollars)));
    check(listed.length > 0 && JSON.stringify(shownIds) === JSON.stringify(listed) && costs.every((c) => c > 0),
      `the running and paused sandboxes (${listed.length}) are listed with their cost so far: ${costs}`);
    const n = await page.$eval("body", (b) => Number(b.dataset.refreshed || 0));
    await page.waitForFunction((m) => Number(document.body.dataset.refreshed || 0) > m, { timeout: 20000 }, n);
    check(true, "live refresh runs");
    check(errors.length === 0, "no error in the page's console: " + errors.join("; "));
    if (process.env.TALLY_SCREENSHOT) {
      await page.screenshot({ path: process.env.TALLY_SCREENSHOT, fullPage: true });
      console.log("screenshot:", process.env.TALLY_SCREENSHOT);
    }
  } finally {
    await browser.close();
  }
})().catch((e) => {
  console.error("FAIL:", e.message);
  process.exit(1);
});
