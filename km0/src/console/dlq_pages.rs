//! The dead-letter pages: the list with its filters and the latest operator actions, and one
//! dead letter with its headers, payload, history and the actions on it.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use entrega::dlq::{DeadLetter, DlqFilter};
use entrega_core::{DeadClass, DeadLetterId};

use super::html::{bad_request, error_page, esc, failure, page, query_value, table, time, Section};
use super::Console;

/// Most rows the list shows.
const LIST_LIMIT: usize = 200;
/// Operator actions shown under the list.
const AUDIT_SHOWN: usize = 20;
/// The columns of a dead letter's row ([`letter_row`]).
const LETTER_COLUMNS: [&str; 10] = [
    "id",
    "clave",
    "tipo",
    "clase",
    "código",
    "motivo",
    "intentos",
    "reenvíos",
    "muerto en",
    "estado",
];

/// `GET /console/dlq`: dead letters, filtered by `tipo`, `motivo` (text), `clase` and
/// `estado` (`pendientes`, `todos`).
#[utoipa::path(
    get,
    path = "/console/dlq",
    tag = "console",
    params(
        ("tipo" = Option<String>, Query, description = "Only this event type"),
        ("motivo" = Option<String>, Query, description = "Only reasons containing this text"),
        ("clase" = Option<String>, Query, description = "Only this class of failure"),
        ("estado" = Option<String>, Query, description = "`pendientes` (default) or `todos`"),
    ),
    responses(
        (status = 200, description = "The dead letters page.", content_type = "text/html", body = String),
        (status = 400, description = "A filter that is not one.", content_type = "text/html", body = String),
        (status = 401, description = "From another host, without an operator's token.", body = super::auth::RefusalBody),
        (status = 403, description = "From another host, and no operator is configured.", body = super::auth::RefusalBody),
    )
)]
pub(super) async fn dead_letters(
    State(console): State<Arc<Console>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let get = |k: &str| q.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let mut filter = DlqFilter::all();
    if let Some(kind) = get("tipo") {
        filter = filter.with_kind(kind);
    }
    if let Some(reason) = get("motivo") {
        filter = filter.with_reason(reason);
    }
    if let Some(class) = get("clase") {
        match DeadClass::parse(class) {
            Some(class) => filter = filter.with_failure(class),
            None => {
                return bad_request(&format!("clase desconocida: {class}"));
            }
        }
    }
    let all = get("estado") == Some("todos");
    let mut body = filter_form(&q);
    match console.letters.list(&filter, all).await {
        Ok(letters) => {
            let rows: Vec<Vec<String>> = letters.iter().take(LIST_LIMIT).map(letter_row).collect();
            body.push_str(&format!(
                "<p data-testid=\"dlq-count\">{} mensajes en <code>{}</code></p>\n",
                letters.len(),
                esc(&console.letters.place())
            ));
            body.push_str(&table(
                "dlq",
                &LETTER_COLUMNS,
                &rows,
                "Ningún mensaje muerto con estos filtros.",
            ));
        }
        Err(e) => body.push_str(&failure("no se pudieron leer los mensajes muertos", &e)),
    }
    body.push_str("<h2>Últimas acciones de operador</h2>\n");
    match console.letters.audit(AUDIT_SHOWN).await {
        Ok(entries) => {
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| {
                    vec![
                        time(Some(e.at_ms)),
                        format!(
                            "<span data-testid=\"audit-operator\">{}</span>",
                            esc(&e.operator)
                        ),
                        format!(
                            "<span data-testid=\"audit-action\">{}{}</span>",
                            e.action.as_str(),
                            if e.dry_run { " (ensayo)" } else { "" }
                        ),
                        esc(&e.filter),
                        format!("{} / {} / {}", e.matched, e.applied, e.refused),
                        esc(e.detail.as_deref().unwrap_or("")),
                    ]
                })
                .collect();
            body.push_str(&table(
                "audit",
                &[
                    "cuándo",
                    "operador",
                    "acción",
                    "selección",
                    "elegidos / hechos / rechazados",
                    "detalle",
                ],
                &rows,
                "Ninguna acción todavía.",
            ));
        }
        Err(e) => body.push_str(&failure("no se pudo leer la auditoría", &e)),
    }
    page("Mensajes muertos", Section::DeadLetters, &body).into_response()
}

fn filter_form(q: &HashMap<String, String>) -> String {
    let value = |k: &str| esc(q.get(k).map_or("", String::as_str));
    let classes: String = std::iter::once(String::new())
        .chain(DeadClass::ALL.iter().map(|c| c.as_str().to_owned()))
        .map(|c| {
            let selected = if q.get("clase") == Some(&c) {
                " selected"
            } else {
                ""
            };
            let label = if c.is_empty() { "todas" } else { c.as_str() };
            format!("<option value=\"{c}\"{selected}>{label}</option>")
        })
        .collect();
    let all = if q.get("estado").map(String::as_str) == Some("todos") {
        " checked"
    } else {
        ""
    };
    format!(
        "<form class=\"filters\" method=\"get\" action=\"/console/dlq\">\
         <label>tipo <input name=\"tipo\" value=\"{}\"></label>\
         <label>motivo contiene <input name=\"motivo\" value=\"{}\"></label>\
         <label>clase <select name=\"clase\">{classes}</select></label>\
         <label><input type=\"checkbox\" name=\"estado\" value=\"todos\"{all}> también los ya tratados</label>\
         <button type=\"submit\">Filtrar</button></form>\n",
        value("tipo"),
        value("motivo"),
    )
}

fn letter_row(l: &DeadLetter) -> Vec<String> {
    let id = l.id.to_string();
    vec![
        format!(
            "<a href=\"/console/dlq/letter?id={}\" data-testid=\"dlq-link\">{}</a>",
            query_value(&id),
            esc(&id)
        ),
        esc(l.key.as_deref().unwrap_or("")),
        esc(l.kind.as_deref().unwrap_or("")),
        esc(l.failure.map_or("", |c| c.as_str())),
        esc(l.code.as_deref().unwrap_or("")),
        esc(&l.reason),
        l.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string()),
        l.replays.to_string(),
        time(Some(l.timestamp_ms)),
        format!("<span data-testid=\"dlq-state\">{}</span>", l.state()),
    ]
}

/// `GET /console/dlq/letter?id=<topic>/<partition>/<offset>`: one dead letter, its history
/// and the actions on it.
#[utoipa::path(
    get,
    path = "/console/dlq/letter",
    tag = "console",
    params(("id" = String, Query, description = "`<dlq-topic>/<partition>/<offset>`")),
    responses(
        (status = 200, description = "One dead letter, its history and actions.", content_type = "text/html", body = String),
        (status = 400, description = "No id, or not one.", content_type = "text/html", body = String),
        (status = 404, description = "No such dead letter.", content_type = "text/html", body = String),
        (status = 401, description = "From another host, without an operator's token.", body = super::auth::RefusalBody),
        (status = 403, description = "From another host, and no operator is configured.", body = super::auth::RefusalBody),
    )
)]
pub(super) async fn dead_letter(
    State(console): State<Arc<Console>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(raw) = q.get("id") else {
        return bad_request("falta el parámetro id");
    };
    let id: DeadLetterId = match raw.parse() {
        Ok(id) => id,
        Err(e) => return bad_request(&format!("id no válido: {e}")),
    };
    let (letter, history) = match console.letters.show(&id).await {
        Ok(found) => found,
        Err(e) => {
            let (status, what) = if e.is_usage() {
                (StatusCode::NOT_FOUND, "no existe")
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, "no se pudo leer")
            };
            let message = failure(what, &e);
            return error_page(status, "Mensaje muerto", Section::DeadLetters, &message);
        }
    };
    let mut body = format!(
        "<dl class=\"figures\" data-testid=\"letter\">\
         <dt>id</dt><dd>{}</dd><dt>estado</dt><dd data-testid=\"letter-state\">{}</dd>\
         <dt>clave</dt><dd>{}</dd><dt>tipo</dt><dd>{}</dd><dt>id_evento</dt><dd>{}</dd>\
         <dt>clase</dt><dd>{}</dd><dt>código</dt><dd>{}</dd><dt>motivo</dt><dd>{}</dd>\
         <dt>intentos</dt><dd>{}</dd><dt>reenvíos</dt><dd>{}</dd>\
         <dt>origen</dt><dd>{} / {} / {} (grupo {})</dd><dt>muerto en</dt><dd>{}</dd></dl>\n",
        esc(&letter.id.to_string()),
        letter.state(),
        esc(letter.key.as_deref().unwrap_or("")),
        esc(letter.kind.as_deref().unwrap_or("")),
        esc(letter.event_id.as_deref().unwrap_or("")),
        esc(letter.failure.map_or("", |c| c.as_str())),
        esc(letter.code.as_deref().unwrap_or("")),
        esc(&letter.reason),
        letter
            .attempts
            .map_or_else(|| "-".to_owned(), |a| a.to_string()),
        letter.replays,
        esc(&letter.origin.topic),
        letter
            .origin
            .partition
            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
        letter
            .origin
            .offset
            .map_or_else(|| "-".to_owned(), |o| o.to_string()),
        esc(letter.origin.group.as_deref().unwrap_or("-")),
        time(Some(letter.timestamp_ms)),
    );
    if letter.is_pending() {
        body.push_str(&format!(
            "<section class=\"actions\" data-id=\"{}\">\
             <button type=\"button\" data-action=\"replay-dry\">Reenviar (ensayo)</button>\
             <button type=\"button\" data-action=\"replay\">Reenviar</button>\
             <label>motivo <input id=\"discard-reason\" name=\"reason\"></label>\
             <button type=\"button\" data-action=\"discard\">Descartar</button></section>\n",
            esc(&letter.id.to_string())
        ));
    } else if let Some(mark) = &letter.mark {
        body.push_str(&format!(
            "<p data-testid=\"letter-mark\">{} por {} el {}{}</p>\n",
            mark.state.as_str(),
            esc(&mark.operator),
            time(Some(mark.at_ms)),
            mark.reason
                .as_deref()
                .map(|r| format!(": {}", esc(r)))
                .unwrap_or_default()
        ));
    }
    let headers: Vec<Vec<String>> = letter
        .headers
        .iter()
        .map(|(n, v)| vec![format!("<code>{}</code>", esc(n)), esc(v)])
        .collect();
    body.push_str("<h2>Cabeceras</h2>\n");
    body.push_str(&table(
        "letter-headers",
        &["nombre", "valor"],
        &headers,
        "Sin cabeceras.",
    ));
    let payload = serde_json::to_string_pretty(&letter.payload_json()).unwrap_or_default();
    body.push_str(&format!(
        "<h2>Contenido</h2>\n<pre data-testid=\"letter-payload\">{}</pre>\n",
        esc(&payload)
    ));
    let rows: Vec<Vec<String>> = history.iter().map(letter_row).collect();
    body.push_str("<h2>Historia del evento</h2>\n");
    body.push_str(&table("letter-history", &LETTER_COLUMNS, &rows, ""));
    page("Mensaje muerto", Section::DeadLetters, &body).into_response()
}
