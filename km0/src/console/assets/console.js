// The km0 console's actions. Pages are rendered by the server; this only sends the actions
// (replay, discard, saga retry) with the operator token as `Authorization: Bearer`, kept in
// this tab's sessionStorage, and shows what the server answered.
"use strict";

const TOKEN_KEY = "km0.console.token";

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
    show("No se pudo contactar con el servidor: " + e, false);
    return null;
  }
  const answer = await response.json().catch(() => ({ error: "respuesta no válida" }));
  if (!response.ok) {
    show("Rechazado (" + response.status + "): " + (answer.error || "sin motivo"), false);
    return null;
  }
  return answer;
}

function describe(report) {
  const lines = [
    (report.dry_run ? "Ensayo: nada cambió. " : "") +
      report.action + ": " + report.applied.length + " de " + report.matched,
  ];
  for (const a of report.applied) lines.push("  " + a.id + " → " + a.topic);
  for (const r of report.refused) lines.push("  rechazado " + r.id + ": " + r.reason);
  return lines.join("\n");
}

async function whoami() {
  const label = document.getElementById("operator");
  if (!label) return;
  if (!token()) {
    label.textContent = "sin token";
    return;
  }
  const response = await fetch("/console/api/whoami", {
    headers: { Authorization: "Bearer " + token() },
  }).catch(() => null);
  if (response && response.ok) {
    const answer = await response.json();
    label.textContent = "operador: " + answer.operator;
  } else {
    label.textContent = "token no válido";
  }
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
      whoami();
    });
  }
  whoami();

  document.querySelectorAll("[data-action]").forEach((button) => {
    button.addEventListener("click", async () => {
      const action = button.dataset.action;
      const box = button.closest(".actions");
      if (action === "saga-retry") {
        const id = box.dataset.saga;
        const answer = await send("/console/api/sagas/" + encodeURIComponent(id) + "/retry", {});
        if (answer) {
          show("Saga " + answer.saga + " reintentada por " + answer.retried_by, true);
          setTimeout(() => location.reload(), 800);
        }
        return;
      }
      const ids = [box.dataset.id];
      let answer;
      if (action === "discard") {
        const reason = document.getElementById("discard-reason").value.trim();
        if (!reason) {
          show("Descartar necesita un motivo.", false);
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
    });
  });
});
