// The km0 console's script. Pages are rendered by the server; this sends the actions (replay,
// discard, saga retry; one letter or every letter a filter selects) with the operator token as
// `Authorization: Bearer`, kept in this tab's sessionStorage, shows what the server answered,
// and refreshes the page's live part every few seconds while the operator is not acting.
"use strict";

const TOKEN_KEY = "km0.console.token";
const REFRESH_KEY = "km0.console.refresh";

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function show(text, ok) {
  const out = document.getElementById("result");
  if (!out) return;
  out.hidden = false;
  out.className = ok ? "ok" : "refused";
  out.textContent = text;
}

async function send(path, body) {
  const headers = { "Content-Type": "application/json" };
  if (token()) headers.Authorization = "Bearer " + token();
  let response;
  try {
    response = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
  } catch (e) {
    show("Could not reach the server: " + e, false);
    return null;
  }
  const answer = await response.json().catch(() => ({ error: "not a JSON answer" }));
  if (!response.ok) {
    show("Refused (" + response.status + "): " + (answer.error || "no reason given"), false);
    return null;
  }
  return answer;
}

function describe(report) {
  const lines = [
    (report.dry_run ? "Dry run, nothing changed. " : "") +
      report.action + ": " + report.applied.length + " of " + report.matched,
  ];
  const listed = report.applied.slice(0, 20);
  for (const a of listed) lines.push("  " + a.id + " -> " + a.topic);
  if (report.applied.length > listed.length) {
    lines.push("  ... and " + (report.applied.length - listed.length) + " more");
  }
  for (const r of report.refused.slice(0, 20)) lines.push("  refused " + r.id + ": " + r.reason);
  return lines.join("\n");
}

async function whoami() {
  const label = document.getElementById("operator");
  if (!label) return;
  if (!token()) {
    label.textContent = "no token";
    return;
  }
  const response = await fetch("/console/api/whoami", {
    headers: { Authorization: "Bearer " + token() },
  }).catch(() => null);
  if (response && response.ok) {
    const answer = await response.json();
    label.textContent = "operator: " + answer.operator;
  } else {
    label.textContent = "token not valid";
  }
}

// While an operator acts (a confirmation waits, a field has focus), the page holds still.
let acting = false;

function busy() {
  const focused = document.activeElement;
  return acting || (focused && ["INPUT", "SELECT", "TEXTAREA"].includes(focused.tagName));
}

function refreshOn() {
  return localStorage.getItem(REFRESH_KEY) !== "off";
}

function stamp(text) {
  const out = document.getElementById("refreshed");
  if (out) out.textContent = text;
}

// One refresh at a time; the next is planned once this one is done, however slow.
async function refreshLive() {
  if (!refreshOn() || document.hidden) return;
  if (busy()) {
    stamp(acting ? "paused while an action waits" : "");
    return;
  }
  const response = await fetch(location.href, { headers: { Accept: "text/html" } }).catch(() => null);
  if (!response || !response.ok) {
    stamp("could not refresh");
    return;
  }
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
  const incoming = fresh.querySelectorAll(".live");
  const current = document.querySelectorAll(".live");
  if (incoming.length !== current.length || busy()) return;
  current.forEach((part, i) => {
    part.innerHTML = incoming[i].innerHTML;
  });
  wire(document);
  stamp("updated " + new Date().toLocaleTimeString());
}

function startRefresh() {
  const live = document.querySelector("[data-refresh]");
  if (!live) return;
  const seconds = Number(live.dataset.refresh) || 5;
  const header = document.querySelector("main h1");
  const control = document.createElement("label");
  control.className = "refresh";
  control.innerHTML =
    '<input type="checkbox" id="auto-refresh" data-testid="auto-refresh"> Refresh every ' +
    seconds + ' s <span id="refreshed" class="muted"></span>';
  header.after(control);
  const box = control.querySelector("input");
  box.checked = refreshOn();
  box.addEventListener("change", () => {
    localStorage.setItem(REFRESH_KEY, box.checked ? "on" : "off");
    box.blur();
  });
  const next = () => setTimeout(async () => {
    await refreshLive().catch(() => stamp("could not refresh"));
    next();
  }, seconds * 1000);
  next();
}

async function onLetterAction(button) {
  const action = button.dataset.action;
  const box = button.closest(".actions");
  if (action === "saga-retry") {
    const id = box.dataset.saga;
    const answer = await send("/console/api/sagas/" + encodeURIComponent(id) + "/retry", {});
    if (answer) {
      show("Saga " + answer.saga + " retried by " + answer.retried_by, true);
      setTimeout(() => location.reload(), 800);
    }
    return;
  }
  const ids = [box.dataset.id];
  let answer;
  if (action === "discard") {
    const reason = document.getElementById("discard-reason").value.trim();
    if (!reason) {
      show("A discard needs a reason.", false);
      return;
    }
    answer = await send("/console/api/dlq/discard", { ids, reason });
  } else {
    answer = await send("/console/api/dlq/replay", { ids, dry_run: action === "replay-dry" });
  }
  if (answer) {
    show(describe(answer), true);
    if (!answer.dry_run) setTimeout(() => location.reload(), 800);
  }
}

// Bulk: the dry run first; its count and selection token are what the confirmation sends as
// `expected` and `selection`, so the server refuses if the selection changed in between. Until it is confirmed or cancelled the
// page holds still; a reason changed after the dry run needs a new dry run.
async function onBulk(button) {
  const panel = button.closest(".bulk");
  const action = button.dataset.bulk;
  const filter = {};
  for (const name of ["type", "reason", "failure"]) {
    if (panel.dataset[name]) filter[name] = panel.dataset[name];
  }
  const reasonField = document.getElementById("bulk-reason");
  const body = { filter, dry_run: true };
  if (action === "discard") {
    body.reason = reasonField.value.trim();
    if (!body.reason) {
      show("A discard needs a reason.", false);
      return;
    }
  }
  const confirm = panel.querySelector("[data-bulk-confirm]");
  const cancel = panel.querySelector("[data-bulk-cancel]");
  const done = () => {
    acting = false;
    confirm.hidden = true;
    cancel.hidden = true;
  };
  acting = true;
  const dry = await send("/console/api/dlq/" + action, body);
  if (!dry || dry.applied.length === 0) {
    if (dry) show(describe(dry), true);
    done();
    return;
  }
  show(describe(dry), true);
  confirm.hidden = false;
  cancel.hidden = false;
  confirm.textContent = "Confirm: " + action + " " + dry.applied.length + " of " + dry.matched;
  cancel.onclick = () => {
    done();
    show("Cancelled: nothing was done.", true);
  };
  confirm.onclick = async () => {
    if (action === "discard" && reasonField.value.trim() !== body.reason) {
      done();
      show("The reason changed after the dry run: run it again.", false);
      return;
    }
    confirm.disabled = true;
    const answer = await send("/console/api/dlq/" + action,
      Object.assign({}, body, { dry_run: false, expected: dry.matched, selection: dry.selection }));
    confirm.disabled = false;
    done();
    if (answer) {
      show(describe(answer), true);
      setTimeout(() => location.reload(), 800);
    }
  };
}

// Buttons inside a refreshed part are new elements: wire them again.
function wire(root) {
  root.querySelectorAll("[data-action]").forEach((button) => {
    button.onclick = () => onLetterAction(button);
  });
  root.querySelectorAll("[data-bulk]").forEach((button) => {
    button.onclick = () => onBulk(button);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("token-form");
  if (form) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const value = document.getElementById("token").value.trim();
      if (value) sessionStorage.setItem(TOKEN_KEY, value);
      else sessionStorage.removeItem(TOKEN_KEY);
      document.getElementById("token").value = "";
      document.getElementById("token").blur();
      whoami();
    });
  }
  whoami();
  wire(document);
  startRefresh();
});
