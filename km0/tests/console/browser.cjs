// Drives the km0 console in headless Chromium (Debian's chromium, driven by playwright-core).
// Called by km0/tests/processes/console_browser.rs, which set up the state and checks the databases
// afterwards. Environment: CONSOLE (base URL of /console), PEDIDOS (base URL of the orders
// API), TOKEN (an operator's secret), ORDER_DLQ (the key of the dead letter to replay),
// ORDER_DLQ_REASON (text only its reason holds), ORDER_SAGA (an order whose saga completed),
// SHOTS (directory for screenshots), KM0_CHROMIUM, KM0_NODE_MODULES.
// Prints one JSON line of what it saw; exits non-zero at the first expectation that fails.
"use strict";

const path = require("path");
const { chromium } = require(path.join(process.env.KM0_NODE_MODULES, "playwright-core"));

const { CONSOLE, PEDIDOS, TOKEN, ORDER_DLQ, ORDER_DLQ_REASON, ORDER_SAGA, SHOTS } = process.env;
const seen = {};

function expect(condition, what) {
  if (!condition) throw new Error("expected " + what);
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, name + ".png"), fullPage: true });
}

async function resultText(page, contains, atStart = false) {
  const result = page.getByTestId("result");
  await result.waitFor({ state: "visible" });
  await page.waitForFunction(
    ([text, start]) => {
      const shown = document.getElementById("result").textContent;
      return start ? shown.startsWith(text) : shown.includes(text);
    },
    [contains, atStart],
    { timeout: 10000 },
  );
  return result.textContent();
}

// No cell of the table `testid` breaks a word: every cell whose text is one word of up to 24
// characters renders on one line.
async function noWordBroken(page, testid) {
  const broken = await page.evaluate((testid) => {
    const found = [];
    for (const td of document.querySelectorAll("[data-testid=" + testid + "] td")) {
      const text = td.textContent.trim();
      if (!text || /\s/.test(text) || text.length > 24) continue;
      const range = document.createRange();
      range.selectNodeContents(td);
      const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
      if (lines.size > 1) found.push(text);
    }
    return found;
  }, testid);
  seen.broken = seen.broken || {};
  seen.broken[testid] = broken;
  expect(broken.length === 0, "no word of " + testid + " broken: " + broken.join(", "));
}

async function noSideScroll(page, name) {
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  seen.widths = seen.widths || {};
  seen.widths[name] = wide;
  expect(wide <= 1280, name + " to fit 1280 px without scrolling sideways (is " + wide + ")");
  const overflowing = await page.evaluate(() =>
    [...document.querySelectorAll("main section")]
      .filter((s) => s.scrollWidth > s.clientWidth + 1)
      .map((s) => (s.querySelector("h2, h3") || s).textContent.trim().slice(0, 40)));
  expect(overflowing.length === 0, name + "'s sections to fit: " + overflowing.join(", "));
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.KM0_CHROMIUM,
    args: ["--no-sandbox", "--headless=new"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    page.setDefaultTimeout(15000);

    // The overview: every outbox, every group (those this deployment does not run marked),
    // the chart once two samples exist, and it refreshes itself.
    await page.goto(CONSOLE + "/");
    await page.getByTestId("outbox-pending").first().waitFor();
    seen.outbox_services = await page.getByTestId("outbox-service").allInnerTexts();
    seen.lag_rows = await page.getByTestId("lag").locator("tbody tr").count();
    // Every group has a live member once each has heartbeated (the page refreshes itself).
    await page.waitForFunction(
      (rows) => document.querySelectorAll("[data-testid=group-members]").length === rows,
      seen.lag_rows,
      { timeout: 30000 },
    ).catch(() => {});
    seen.idle_groups = await page.getByTestId("group-idle").count();
    seen.running_groups = await page.getByTestId("group-members").count();
    seen.held = await page.getByTestId("held-count").innerText();
    await page.waitForFunction(
      () => document.querySelector("[data-testid=chart-backlog-line]"),
      null,
      { timeout: 40000 },
    );
    seen.chart_lines = await page.locator("[data-testid=chart] polyline").count();
    seen.auto_refresh = await page.getByTestId("auto-refresh").isChecked();
    const completed = () =>
      page.evaluate(() => {
        const link = [...document.querySelectorAll("[data-testid=saga-counts] a")]
          .find((a) => a.textContent === "completed");
        return link ? link.closest("tr").lastElementChild.textContent : null;
      });
    seen.completed_before = await completed();
    await page.evaluate(() => { window.km0NotReloaded = true; });
    const placed = await fetch(PEDIDOS + "/pedidos", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        id: "C-LIVE", cliente: "ana", mercado: "girona", tarjeta: "tok_visa",
        lineas: [{ producto: "queso-fresco", cantidad: 1, precio_centimos: 600 }],
        direccion_entrega: { ciudad: "Madrid", codigo_postal: "28013", calle: "Carrer Major 3" },
      }),
    });
    expect(placed.status === 201, "the live order accepted (" + placed.status + ")");
    await page.waitForFunction(
      (before) => {
        const link = [...document.querySelectorAll("[data-testid=saga-counts] a")]
          .find((a) => a.textContent === "completed");
        return link && link.closest("tr").lastElementChild.textContent !== before;
      },
      seen.completed_before,
      { timeout: 60000 },
    );
    seen.completed_after = await completed();
    seen.not_reloaded = await page.evaluate(() => window.km0NotReloaded === true);
    await noSideScroll(page, "overview");
    await noWordBroken(page, "lag");
    await noWordBroken(page, "outboxes");
    await shot(page, "overview");

    // The dead letters, a page at a time with the total.
    await page.goto(CONSOLE + "/dlq?failure=rechazado");
    seen.dlq_total = await page.getByTestId("dlq-pager-total").innerText();
    seen.dlq_first_page = await page.getByTestId("dlq").locator("tbody tr").count();
    await noSideScroll(page, "dead-letters");
    await noWordBroken(page, "dlq");
    await shot(page, "dead-letters");
    await page.getByTestId("dlq-pager-next").click();
    await page.getByTestId("dlq").waitFor();
    seen.dlq_second_page = await page.getByTestId("dlq").locator("tbody tr").count();
    seen.dlq_second_range = await page.getByTestId("dlq-pager-range").innerText();

    // The one letter to replay, found by its key.
    await page.goto(CONSOLE + "/dlq?failure=rechazado&reason=" + encodeURIComponent(ORDER_DLQ_REASON));
    const row = page.getByTestId("dlq").locator("tbody tr", { hasText: ORDER_DLQ });
    await row.first().waitFor();
    seen.dlq_row = (await row.first().innerText()).replace(/\s+/g, " ");
    expect(seen.dlq_row.includes("producto_desconocido"), "the handler's code in the row");
    await row.first().getByTestId("dlq-link").click();
    await page.getByTestId("letter").waitFor();
    expect((await page.getByTestId("letter-state").innerText()) === "pending", "a pending letter");
    await noSideScroll(page, "dead-letter");
    await shot(page, "dead-letter");

    // Without a token, the replay is refused.
    await page.locator("button[data-action=replay]").click();
    seen.without_token = await resultText(page, "Refused (401)");
    await shot(page, "replay-refused");

    // With the operator's token: a dry run, then the replay.
    await page.locator("#token").fill(TOKEN);
    await page.locator("#token-form button").click();
    await page.waitForFunction(() =>
      document.getElementById("operator").textContent.startsWith("operator:"));
    seen.operator = await page.getByTestId("operator").innerText();
    await page.locator("button[data-action=replay-dry]").click();
    seen.dry_run = await resultText(page, "Dry run");
    // A replay reloads the page a moment later: the next navigation waits for that reload.
    const replayReload = page.waitForEvent("load");
    await page.locator("button[data-action=replay]").click();
    seen.replay = await resultText(page, "replay: 1 of 1", true);
    await replayReload;
    await page.waitForFunction(() => {
      const state = document.querySelector("[data-testid=letter-state]");
      return state && state.textContent === "replayed";
    }, null, { timeout: 15000 });
    seen.mark = await page.getByTestId("letter-mark").innerText();
    await shot(page, "dead-letter-replayed");

    // Every other pending letter of the failure, discarded at once: dry run, then confirm.
    await page.goto(CONSOLE + "/dlq?failure=rechazado");
    seen.bulk_count = await page.getByTestId("bulk-count").innerText();
    await page.locator("#bulk-reason").fill("the products were withdrawn");
    // A dry run, cancelled: nothing asked of the server, the confirmation gone.
    await page.locator("button[data-bulk=discard]").click();
    await resultText(page, "Dry run");
    await page.getByTestId("bulk-cancel").click();
    seen.cancelled = await resultText(page, "Cancelled");
    seen.confirm_after_cancel = await page.getByTestId("bulk-confirm").isVisible();
    // Then for real: while the confirmation waits, the page holds still past a refresh.
    await page.locator("button[data-bulk=discard]").click();
    seen.bulk_dry_run = await resultText(page, "Dry run");
    const confirm = page.getByTestId("bulk-confirm");
    await confirm.waitFor({ state: "visible" });
    seen.bulk_confirm = await confirm.innerText();
    await page.locator("body").click({ position: { x: 5, y: 5 } });
    await page.waitForTimeout(7000);
    seen.held_still = {
      confirm: await confirm.isVisible(),
      reason: await page.locator("#bulk-reason").inputValue(),
      stamp: await page.locator("#refreshed").innerText(),
    };
    await shot(page, "bulk-dry-run");
    const bulkReload = page.waitForEvent("load");
    await confirm.click();
    await page.waitForFunction(
      () => {
        const text = document.getElementById("result").textContent;
        return text.startsWith("discard:") || text.startsWith("Refused");
      },
      null,
      { timeout: 15000 },
    );
    seen.bulk_done = await page.getByTestId("result").textContent();
    expect(seen.bulk_done.startsWith("discard: 60 of 60"), "the bulk discard done");
    await bulkReload;
    await page.getByTestId("dlq-empty").waitFor({ timeout: 15000 });
    await page.getByTestId("held-total").waitFor();
    await shot(page, "dead-letters-after-bulk");

    // A saga's timeline renders.
    await page.goto(CONSOLE + "/sagas/" + encodeURIComponent(ORDER_SAGA));
    seen.saga_state = await page.getByTestId("saga-state").innerText();
    seen.timeline = await page.getByTestId("timeline-what").allInnerTexts();
    expect(seen.timeline.length >= 4, "a timeline of several entries");
    seen.timeline_raw_json = await page.evaluate(() =>
      [...document.querySelectorAll("[data-testid=timeline] td")].some((td) =>
        td.textContent.trim().startsWith("{")));
    await noSideScroll(page, "saga");
    await noWordBroken(page, "timeline");
    await shot(page, "saga");

    // The sagas, with the total of the state.
    await page.goto(CONSOLE + "/sagas?state=completed");
    seen.sagas_total = await page.getByTestId("sagas-pager-total").innerText();
    await noSideScroll(page, "sagas");
    await noWordBroken(page, "sagas");
    await shot(page, "sagas");

    // The order's trace: one trace id across the services.
    await page.goto(CONSOLE + "/trace?order=" + encodeURIComponent(ORDER_SAGA));
    seen.trace_ids = await page.getByTestId("trace-id").allInnerTexts();
    seen.trace_services = [...new Set(await page.getByTestId("trace-service").allInnerTexts())];
    await noSideScroll(page, "trace");
    await shot(page, "trace");
    console.log(JSON.stringify(seen));
  } finally {
    await browser.close();
  }
})().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  console.log(JSON.stringify(seen));
  process.exit(1);
});
