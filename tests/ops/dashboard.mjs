// Opens the ring-utilization dashboard in headless Chromium (Debian's /usr/bin/chromium driven
// by playwright-core) while streaming requests keep the ring busy, checks that every stage
// shows non-zero utilization and that the timeline shows micro-batches, and saves a
// screenshot.
// Usage: node tests/ops/dashboard.mjs <server_url> <screenshot.png> [api_key]
//   server_url: e.g. http://127.0.0.1:8000 (the dashboard is at /dashboard)
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import {chromium} from "playwright-core";

const [server, screenshot, apiKey] = process.argv.slice(2);
if (!server || !screenshot) {
  console.error("usage: dashboard.mjs <server_url> <screenshot.png> [api_key]");
  process.exit(2);
}
const headers = {"Content-Type": "application/json"};
if (apiKey) headers.Authorization = `Bearer ${apiKey}`;

const data = await (await fetch(`${server}/dashboard/data`)).json();
const numStages = data.stages.length;
assert.ok(numStages >= 1, "the ring has no stages");
const model = (await (await fetch(`${server}/v1/models`, {headers})).json()).data[0].id;
console.log(`ring: ${numStages} stages, model ${model}`);

// Load: streaming completions, several at a time, until told to stop.
let loading = true;
let completed = 0;
async function worker(i) {
  while (loading) {
    const resp = await fetch(`${server}/v1/completions`, {
      method: "POST", headers,
      body: JSON.stringify({model, prompt: `load ${i}: the quick brown fox`, max_tokens: 48,
                            temperature: 0, stream: true, ignore_eos: true})});
    assert.equal(resp.status, 200, await resp.clone().text());
    await resp.text();  // read the whole stream
    completed++;
  }
}
const workers = Array.from({length: numStages + 1}, (_, i) => worker(i));

const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "rs-chromium-"));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: {width: 1400, height: 900},
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let exitCode = 0;
try {
  const page = context.pages()[0] || await context.newPage();
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  await page.goto(`${server}/dashboard`);
  await page.waitForSelector("#conn.ok", {timeout: 15_000});
  // Every stage row and ring node reports a non-zero busy fraction while the load runs.
  await page.waitForFunction((n) => {
    for (let i = 0; i < n; i++) {
      const cell = document.querySelector(`[data-testid="stage-busy-${i}"]`);
      const node = document.querySelector(`[data-testid="ring-stage-${i}"]`);
      if (!cell || !node) return false;
      if (!(Number(cell.dataset.busy) > 0) || !(Number(node.dataset.busy) > 0)) return false;
    }
    return document.querySelector("#timeline-legend").textContent.includes("stage trips");
  }, numStages, {timeout: 60_000, polling: 100});
  const busy = await page.$$eval("[data-testid^=stage-busy-]",
                                 (cells) => cells.map((c) => Number(c.dataset.busy)));
  console.log(`busy fractions: ${busy.map((b) => b.toFixed(3)).join(" ")}`);
  assert.equal(busy.length, numStages);
  busy.forEach((b, i) => assert.ok(b > 0, `stage ${i} shows no utilization`));
  // A few more updates so that the sparkline and timeline have history in the picture.
  const updates = Number(await page.getAttribute("body", "data-updates"));
  await page.waitForFunction((u) => Number(document.body.dataset.updates) >= u + 3, updates,
                             {timeout: 30_000, polling: 100});
  fs.mkdirSync(path.dirname(screenshot), {recursive: true});
  await page.screenshot({path: screenshot, fullPage: true});
  console.log(`screenshot: ${screenshot}`);
  assert.deepEqual(pageErrors, [], "the page threw");
  console.log("dashboard check passed");
} catch (e) {
  console.log(`dashboard check failed: ${e && e.stack ? e.stack : e}`);
  try {
    const page = context.pages()[0];
    console.log(`page state: conn="${await page.textContent("#conn")}", ` +
                `updates=${await page.getAttribute("body", "data-updates")}, ` +
                `polls=${await page.evaluate(() => window.__polls)}`);
  } catch (ignored) {
    // the page is gone
  }
  exitCode = 1;
} finally {
  loading = false;
  await Promise.allSettled(workers);
  console.log(`${completed} load requests completed`);
  await context.close();
  fs.rmSync(userDataDir, {recursive: true, force: true});
}
process.exit(exitCode);
