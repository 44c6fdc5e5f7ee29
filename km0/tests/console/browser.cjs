// Drives the km0 console in headless Chromium (Debian's chromium, driven by playwright-core).
// Called by km0/tests/processes/console_browser.rs, which set up the state and checks the databases
// afterwards. Environment: CONSOLE (base URL of /console), TOKEN (an operator's secret),
// ORDER_DLQ (the key of the dead letter to replay), ORDER_SAGA (an order whose saga
// completed), SHOTS (directory for screenshots), KM0_CHROMIUM, KM0_NODE_MODULES.
// Prints one JSON line of what it saw; exits non-zero at the first expectation that fails.
"use strict";

const path = require("path");
const { chromium } = require(path.join(process.env.KM0_NODE_MODULES, "playwright-core"));

const { CONSOLE, TOKEN, ORDER_DLQ, ORDER_SAGA, SHOTS } = process.env;
const seen = {};

function expect(condition, what) {
  if (!condition) throw new Error("expected " + what);
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, name + ".png"), fullPage: true });
}

async function resultText(page, contains) {
  const result = page.getByTestId("result");
  await result.waitFor({ state: "visible" });
  await page.waitForFunction(
    (text) => document.getElementById("result").textContent.includes(text),
    contains,
    { timeout: 10000 },
  );
  return result.textContent();
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.KM0_CHROMIUM,
    args: ["--no-sandbox", "--headless=new"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    page.setDefaultTimeout(15000);

    // The overview renders the outbox, the lag and the dead letters.
    await page.goto(CONSOLE + "/");
    await page.getByTestId("outbox-pending").waitFor();
    seen.lag_rows = await page.getByTestId("lag").locator("tbody tr").count();
    expect(seen.lag_rows > 0, "lag rows on the overview");
    await shot(page, "overview");

    // The dead letter appears in the list, with its class and code.
    await page.goto(CONSOLE + "/dlq?clase=rechazado");
    const row = page.getByTestId("dlq").locator("tbody tr", { hasText: ORDER_DLQ });
    await row.first().waitFor();
    seen.dlq_row = (await row.first().innerText()).replace(/\s+/g, " ");
    expect(seen.dlq_row.includes("producto_desconocido"), "the handler's code in the row");
    await shot(page, "dead-letters");
    await row.first().getByTestId("dlq-link").click();
    await page.getByTestId("letter").waitFor();
    expect((await page.getByTestId("letter-state").innerText()) === "pending", "a pending letter");
    await shot(page, "dead-letter");

    // Without a token, the replay is refused.
    await page.locator("button[data-action=replay]").click();
    seen.without_token = await resultText(page, "Rechazado (401)");
    await shot(page, "replay-refused");

    // With the operator's token: a dry run, then the replay.
    await page.locator("#token").fill(TOKEN);
    await page.locator("#token-form button").click();
    await page.waitForFunction(() =>
      document.getElementById("operator").textContent.startsWith("operador:"));
    seen.operator = await page.getByTestId("operator").innerText();
    await page.locator("button[data-action=replay-dry]").click();
    seen.dry_run = await resultText(page, "Ensayo");
    await page.locator("button[data-action=replay]").click();
    seen.replay = await resultText(page, "replay: 1 de 1");
    await page.waitForFunction(() => {
      const state = document.querySelector("[data-testid=letter-state]");
      return state && state.textContent === "replayed";
    }, null, { timeout: 15000 });
    seen.mark = await page.getByTestId("letter-mark").innerText();
    await shot(page, "dead-letter-replayed");

    // A saga's timeline renders.
    await page.goto(CONSOLE + "/sagas/" + encodeURIComponent(ORDER_SAGA));
    seen.saga_state = await page.getByTestId("saga-state").innerText();
    seen.timeline = await page.getByTestId("timeline-what").allInnerTexts();
    expect(seen.timeline.length >= 4, "a timeline of several entries");
    await shot(page, "saga");

    // The order's trace: one trace id across the services.
    await page.goto(CONSOLE + "/trace?pedido=" + encodeURIComponent(ORDER_SAGA));
    seen.trace_ids = await page.getByTestId("trace-id").allInnerTexts();
    seen.trace_services = [...new Set(await page.getByTestId("trace-service").allInnerTexts())];
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
