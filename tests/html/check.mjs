// Drives an HTML report of scenario-run in a real headless browser (Debian's chromium through
// playwright-core) and checks what a reviewer does with it: the page renders with no error and
// no network request, the timeline is drawn, the text filter and the outcome filters work
// (also from a link's #fragment) and the timeline follows them, the legend explains every
// colour the timeline uses, the timeline links open a scenario; then a 1280x800
// screenshot is written.
//
//   node tests/html/check.mjs REPORT.html SCREENSHOT.png EXPECT.json
//
// EXPECT.json: {"total": N, "byOutcome": {"failed": N, ...}, "name": "a scenario name",
//               "sandboxLanes": N}. Prints one line per check; exits 1 on the first failure.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { chromium } from "playwright-core";

const [report, screenshot, expectFile] = process.argv.slice(2);
if (!report || !screenshot || !expectFile) {
  console.error("usage: node check.mjs REPORT.html SCREENSHOT.png EXPECT.json");
  process.exit(2);
}
const expect = JSON.parse(readFileSync(expectFile, "utf8"));
const url = pathToFileURL(resolve(report)).href;
const profile = mkdtempSync(join(tmpdir(), "sr-html-chromium-"));

function check(ok, what) {
  if (!ok) {
    throw new Error(`FAILED: ${what}`);
  }
  console.log(`ok: ${what}`);
}

const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1280, height: 800 },
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
  ],
});
let failed = false;
try {
  const page = context.pages()[0] ?? (await context.newPage());
  const errors = [];
  const requests = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  page.on("request", (r) => !r.url().startsWith("file:") && requests.push(r.url()));

  await page.goto(url);
  await page.waitForSelector("html[data-ready='1']", { timeout: 10000 });
  const visible = () => page.$$eval("details.scenario", (ds) => ds.filter((d) => !d.hidden).length);
  const shown = () => page.textContent("#shown");

  check(errors.length === 0, `no script errors (${errors.join("; ")})`);
  check(requests.length === 0, `no network requests (${requests.join(", ")})`);
  check((await page.title()).startsWith("scenario-run "), "the title names the run");
  check((await visible()) === expect.total, `all ${expect.total} scenarios listed`);
  check((await shown()) === `${expect.total} of ${expect.total} shown`, "the count says so");
  const lanes = await page.$$eval("#timeline svg text.lbl", (ts) => ts.filter((t) => t.textContent.startsWith("slot ")).length);
  check(lanes === expect.sandboxLanes, `the timeline has ${expect.sandboxLanes} sandbox lanes (found ${lanes})`);
  const bars = await page.$$eval("#timeline svg rect.runbar", (rs) => rs.length);
  check(bars >= 1, `the timeline has a bar per scenario that ran (${bars})`);
  const box = await page.$eval("#timeline svg", (s) => s.getBoundingClientRect().width);
  check(box > 1000, `the timeline spans the page (${Math.round(box)} px)`);
  const failedOpen = await page.$$eval("details.scenario.failed", (ds) => ds.every((d) => d.open));
  check(failedOpen, "failed scenarios are open");

  // The legend explains every colour the timeline uses, as the browser draws them.
  const colours = (sel, prop) => page.$$eval(sel, (es, p) => [...new Set(es.map((e) => getComputedStyle(e)[p]))], prop);
  const segs = await colours("#timeline svg rect.seg", "fill");
  const segKeys = await colours("#timeline .legend .seg-key", "backgroundColor");
  check(segs.length > 0 && segs.every((c) => segKeys.includes(c)), `the legend explains every step colour (${segs.join(" ")})`);
  const barFills = [...(await colours("#timeline svg rect.runbar", "fill")), ...(await colours("#timeline svg rect.sbx", "fill"))];
  const outKeys = await colours("#timeline .legend .out-key", "backgroundColor");
  check(barFills.every((c) => outKeys.includes(c)), `the legend explains every bar colour (${barFills.join(" ")})`);

  // The timeline follows the filters: the lanes of the scenarios listed, moved up with no
  // gap, and only their sandboxes.
  const allLanes = await page.$$eval("#timeline g.row", (gs) => gs.map((g) => g.dataset.scenario));
  const shownRows = () =>
    page.$$eval("#timeline g.row", (gs) =>
      gs.filter((g) => getComputedStyle(g).display !== "none").map((g) => [g.dataset.scenario, g.getBoundingClientRect().top]),
    );
  const firstTop = (await shownRows())[0][1];
  const chartHeight = () => page.$eval("#timeline svg.chart", (s) => s.viewBox.baseVal.height);
  const fullHeight = await chartHeight();
  async function followsFilters(what) {
    const list = await page.$$eval("details.scenario", (ds) => ds.filter((d) => !d.hidden).map((d) => d.id));
    const rows = await shownRows();
    const want = allLanes.filter((s) => list.includes(s));
    check(JSON.stringify(rows.map((r) => r[0])) === JSON.stringify(want), `the timeline follows ${what} (${rows.length} lanes)`);
    const gaps = rows.slice(1).map((r, i) => r[1] - rows[i][1]);
    const packed = rows.length === 0 || (Math.abs(rows[0][1] - firstTop) < 1 && gaps.every((g) => Math.abs(g - gaps[0]) < 1));
    check(packed, `its lanes move up with no gap (${rows.map((r) => Math.round(r[1]))})`);
    const lives = await page.$$eval("#timeline a.life", (as) => as.map((a) => [a.dataset.scenario, getComputedStyle(a).display !== "none"]));
    check(lives.every(([s, on]) => on === list.includes(s)), `and shows only their sandboxes (${lives.filter((l) => l[1]).length})`);
    const h = await chartHeight();
    check(want.length === allLanes.length ? h === fullHeight : h < fullHeight, `and the chart shrinks to fit (${h} of ${fullHeight})`);
  }

  // Text filter.
  await page.fill("#q", expect.name.toLowerCase());
  const byName = await visible();
  check(byName >= 1 && byName < expect.total, `typing "${expect.name}" narrows the list (${byName})`);
  const names = await page.$$eval("details.scenario:not([hidden]) .name", (ns) => ns.map((n) => n.textContent));
  check(names.every((n) => n.toLowerCase().includes(expect.name.toLowerCase())), `only matching names remain (${names})`);
  await followsFilters("the text filter");
  await page.fill("#q", "no such scenario anywhere");
  check((await visible()) === 0 && (await page.isVisible("#none")), "a filter that matches nothing says so");
  await page.fill("#q", "");
  check((await visible()) === expect.total, "clearing the filter shows all again");

  // Outcome filters: the totals buttons and the check boxes.
  for (const [outcome, n] of Object.entries(expect.byOutcome)) {
    await page.click(`button.total.${outcome}`);
    check((await visible()) === n, `the "${outcome}" button shows ${n}`);
    const outcomes = await page.$$eval("details.scenario:not([hidden])", (ds) => ds.map((d) => d.dataset.outcome));
    check(outcomes.every((o) => o === outcome), `only ${outcome} scenarios remain`);
    await followsFilters(`the "${outcome}" button`);
  }
  await page.click("button.total.all");
  check((await visible()) === expect.total, "the total button shows all");
  await followsFilters("the total button");
  await page.uncheck("input[name=outcome][value=passed]");
  const withoutPassed = expect.total - (expect.byOutcome.passed ?? 0);
  check((await visible()) === withoutPassed, `unticking PASSED leaves ${withoutPassed}`);

  // The state is in the fragment: a link opens the same view.
  const hash = new URL(page.url()).hash;
  check(hash.includes("outcome="), `the filter is in the URL (${hash})`);
  const again = await context.newPage();
  await again.goto(url + hash);
  await again.waitForSelector("html[data-ready='1']");
  const n = await again.$$eval("details.scenario", (ds) => ds.filter((d) => !d.hidden).length);
  check(n === withoutPassed, "a link with the fragment opens the same filtered view");
  await again.close();
  await page.check("input[name=outcome][value=passed]");

  // The timeline links to its scenario and opens it.
  const target = await page.$eval("#timeline a.lane", (a) => a.dataset.scenario);
  await page.$eval(`#${target}`, (d) => (d.open = false));
  await page.click("#timeline a.lane rect.runbar", { timeout: 5000 });
  check(await page.$eval(`#${target}`, (d) => d.open && !d.hidden), "clicking a timeline lane opens its scenario");

  // The screenshot, of the page as it opens.
  await page.goto(url);
  await page.waitForSelector("html[data-ready='1']");
  await page.screenshot({ path: screenshot });
  check(true, `screenshot ${screenshot}`);
  check(errors.length === 0, `still no script errors (${errors.join("; ")})`);
  check(requests.length === 0, `still no network requests (${requests.join(", ")})`);
} catch (e) {
  console.error(e.message);
  failed = true;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
