//! The console's pages: the overview, dead letters and sagas. Each reads the state it shows
//! when asked (nothing is cached), and a part that cannot be read says so in the page instead
//! of failing it whole.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use entrega::dlq::{DeadLetter, DlqFilter};
use entrega::saga::SagaStatus;
use entrega_core::{DeadClass, DeadLetterId};

use super::html::{esc, failure, page, query_value, table, time, Section};
use super::Console;
use crate::ops::lag::lag_report;
use crate::ops::queue_lag::queue_lag_report;
use crate::wiring::AMQP_GROUPS;

/// Most rows a list shows.
const LIST_LIMIT: usize = 200;
/// Operator actions shown under the dead letters.
const AUDIT_SHOWN: usize = 20;

/// `GET /console/`: outbox, consumer lag, dead letters and sagas at a glance.
pub(super) async fn overview(State(console): State<Arc<Console>>) -> Html<String> {
    let mut body = String::new();
    body.push_str("<section><h2>Outbox de pedidos</h2>\n");
    match console.system.outbox_status().await {
        Ok(s) => {
            body.push_str(&format!(
                "<dl class=\"figures\" data-testid=\"outbox\">\
                 <dt>Pendientes</dt><dd data-testid=\"outbox-pending\">{}</dd>\
                 <dt>Más antiguo</dt><dd>{:.1} s</dd>\
                 <dt>Rechazados, en reintento</dt><dd>{}</dd>\
                 <dt>Retenidos para un operador</dt><dd>{}</dd>\
                 <dt>Publicados aún guardados</dt><dd>{}</dd></dl>\n",
                s.pending,
                s.oldest_pending_age_ms.max(0) as f64 / 1000.0,
                s.retrying,
                s.held,
                s.published
            ));
            let rows: Vec<Vec<String>> = s
                .blocked
                .iter()
                .map(|r| {
                    vec![
                        esc(&r.id.to_string()),
                        esc(&r.aggregate_id),
                        esc(&r.kind),
                        r.attempts.to_string(),
                        if r.held_at_ms.is_some() {
                            "retenido".to_owned()
                        } else {
                            format!("reintento {}", time(r.next_attempt_ms))
                        },
                        esc(r.last_error.as_deref().unwrap_or("")),
                    ]
                })
                .collect();
            body.push_str(&table(
                "outbox-blocked",
                &[
                    "id",
                    "agregado_id",
                    "tipo",
                    "intentos",
                    "estado",
                    "último error",
                ],
                &rows,
                "Ninguna fila rechazada.",
            ));
        }
        Err(e) => body.push_str(&failure("no se pudo leer el outbox", &e)),
    }
    body.push_str("</section>\n<section><h2>Consumidores</h2>\n");
    body.push_str(&lag_section(&console).await);
    body.push_str("</section>\n<section><h2>Mensajes muertos</h2>\n");
    match console.letters.list(&DlqFilter::all(), false).await {
        Ok(letters) => body.push_str(&format!(
            "<p><a href=\"/console/dlq\" data-testid=\"dlq-pending\">{} pendientes</a> en <code>{}</code></p>\n",
            letters.len(),
            esc(&console.letters.place())
        )),
        Err(e) => body.push_str(&failure("no se pudieron leer los mensajes muertos", &e)),
    }
    body.push_str("</section>\n<section><h2>Sagas de pedido</h2>\n");
    match console.sagas.counts().await {
        Ok(counts) => {
            let rows: Vec<Vec<String>> = SagaStatus::ALL
                .iter()
                .map(|status| {
                    let n = counts
                        .iter()
                        .find(|(s, _)| s == status)
                        .map_or(0, |(_, n)| *n);
                    vec![
                        format!(
                            "<a href=\"/console/sagas?estado={0}\">{0}</a>",
                            status.as_str()
                        ),
                        n.to_string(),
                    ]
                })
                .collect();
            body.push_str(&table("saga-counts", &["estado", "sagas"], &rows, ""));
        }
        Err(e) => body.push_str(&failure("no se pudieron leer las sagas", &e)),
    }
    body.push_str("</section>\n");
    page("Resumen", Section::Overview, &body)
}

/// Each consumer group's lag (queue depths on RabbitMQ).
async fn lag_section(console: &Console) -> String {
    let mut rows = Vec::new();
    if let Some(amqp) = console.broker.as_amqp() {
        for (group, topic, _) in AMQP_GROUPS {
            match queue_lag_report(amqp, &[group.to_owned()], &[topic.to_owned()]).await {
                Ok(report) => {
                    for g in report.groups {
                        rows.push(vec![
                            esc(&g.group),
                            esc(&g.topic),
                            g.queues.len().to_string(),
                            g.ready.to_string(),
                            g.unacked.map_or_else(|| "-".to_owned(), |u| u.to_string()),
                            g.dead_letters.ready.to_string(),
                        ]);
                    }
                }
                Err(e) => return failure("no se pudieron leer las colas", &e),
            }
        }
        return table(
            "lag",
            &[
                "grupo",
                "tema",
                "colas",
                "listos",
                "sin confirmar",
                "muertos",
            ],
            &rows,
            "Sin grupos.",
        );
    }
    let inspector = console.broker.inspector();
    for (group, topic, _) in AMQP_GROUPS {
        match lag_report(inspector.as_ref(), &[group.to_owned()], &[topic.to_owned()]).await {
            Ok(report) => {
                for g in report.groups {
                    let behind: Vec<String> = g
                        .partitions
                        .iter()
                        .filter(|p| p.lag > 0)
                        .map(|p| format!("p{}: {}", p.partition, p.lag))
                        .collect();
                    rows.push(vec![
                        esc(&g.group),
                        esc(&g.topic),
                        g.partitions.len().to_string(),
                        g.committed.to_string(),
                        g.end.to_string(),
                        format!("<span data-testid=\"lag-value\">{}</span>", g.lag),
                        behind.join(", "),
                    ]);
                }
            }
            Err(e) => return failure("no se pudo leer el retraso", &e),
        }
    }
    table(
        "lag",
        &[
            "grupo",
            "tema",
            "particiones",
            "confirmado",
            "final",
            "retraso",
            "particiones con retraso",
        ],
        &rows,
        "Ningún tema tiene registros todavía.",
    )
}

/// `GET /console/dlq`: dead letters, filtered by `tipo`, `motivo` (text), `clase` and
/// `estado` (`pendientes`, `todos`).
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
                &[
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
                ],
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
        Err(e) if e.is_usage() => {
            return (
                StatusCode::NOT_FOUND,
                page(
                    "Mensaje muerto",
                    Section::DeadLetters,
                    &failure("no existe", &e),
                ),
            )
                .into_response();
        }
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                page(
                    "Mensaje muerto",
                    Section::DeadLetters,
                    &failure("no se pudo leer", &e),
                ),
            )
                .into_response();
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
    body.push_str(&table(
        "letter-history",
        &[
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
        ],
        &rows,
        "",
    ));
    page("Mensaje muerto", Section::DeadLetters, &body).into_response()
}

/// `GET /console/sagas?estado=...`: order sagas, newest first.
pub(super) async fn sagas(
    State(console): State<Arc<Console>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let status = match q
        .get("estado")
        .map(String::as_str)
        .filter(|s| !s.is_empty())
    {
        Some(name) => match SagaStatus::parse(name) {
            Some(status) => Some(status),
            None => return bad_request(&format!("estado desconocido: {name}")),
        },
        None => None,
    };
    let options: String = std::iter::once("")
        .chain(SagaStatus::ALL.iter().map(|s| s.as_str()))
        .map(|s| {
            let selected = if status.map(SagaStatus::as_str) == Some(s) && !s.is_empty() {
                " selected"
            } else {
                ""
            };
            let label = if s.is_empty() { "todos" } else { s };
            format!("<option value=\"{s}\"{selected}>{label}</option>")
        })
        .collect();
    let mut body = format!(
        "<form class=\"filters\" method=\"get\" action=\"/console/sagas\">\
         <label>estado <select name=\"estado\">{options}</select></label>\
         <button type=\"submit\">Filtrar</button></form>\n"
    );
    match console.sagas.list(status, LIST_LIMIT).await {
        Ok(list) => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|s| {
                    vec![
                        format!(
                            "<a href=\"/console/sagas/{}\" data-testid=\"saga-link\">{}</a>",
                            query_value(&s.id),
                            esc(&s.id)
                        ),
                        s.status.as_str().to_owned(),
                        esc(console.sagas.step_name(s.step).unwrap_or("-")),
                        s.phase.as_str().to_owned(),
                        s.attempts.to_string(),
                        esc(s.reason.as_deref().unwrap_or("")),
                        time(Some(s.created_ms)),
                        time(Some(s.updated_ms)),
                    ]
                })
                .collect();
            body.push_str(&table(
                "sagas",
                &[
                    "pedido", "estado", "paso", "fase", "envíos", "motivo", "creada", "cambiada",
                ],
                &rows,
                "Ninguna saga.",
            ));
        }
        Err(e) => body.push_str(&failure("no se pudieron leer las sagas", &e)),
    }
    page("Sagas de pedido", Section::Sagas, &body).into_response()
}

/// `GET /console/sagas/{id}`: one saga and its timeline.
pub(super) async fn saga(State(console): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let (record, history) = match console.sagas.show(&id).await {
        Ok(Some(found)) => found,
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                page(
                    "Saga",
                    Section::Sagas,
                    &format!(
                        "<p class=\"error\" role=\"alert\">No hay saga {}</p>",
                        esc(&id)
                    ),
                ),
            )
                .into_response();
        }
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                page(
                    "Saga",
                    Section::Sagas,
                    &failure("no se pudo leer la saga", &e),
                ),
            )
                .into_response();
        }
    };
    let mut body = format!(
        "<dl class=\"figures\" data-testid=\"saga\">\
         <dt>pedido</dt><dd>{}</dd><dt>estado</dt><dd data-testid=\"saga-state\">{}</dd>\
         <dt>paso</dt><dd>{}</dd><dt>fase</dt><dd>{}</dd><dt>motivo</dt><dd>{}</dd>\
         <dt>creada</dt><dd>{}</dd><dt>cambiada</dt><dd>{}</dd></dl>\n\
         <p><a href=\"/console/trace?pedido={}\">Traza del pedido</a></p>\n",
        esc(&record.id),
        record.status.as_str(),
        esc(console.sagas.step_name(record.step).unwrap_or("-")),
        record.phase.as_str(),
        esc(record.reason.as_deref().unwrap_or("")),
        time(Some(record.created_ms)),
        time(Some(record.updated_ms)),
        query_value(&record.id),
    );
    if record.status == SagaStatus::NeedsOperator {
        body.push_str(&format!(
            "<section class=\"actions\" data-saga=\"{}\">\
             <button type=\"button\" data-action=\"saga-retry\">Reintentar la compensación</button>\
             </section>\n",
            esc(&record.id)
        ));
    }
    let rows: Vec<Vec<String>> = history
        .iter()
        .map(|e| {
            vec![
                e.n.to_string(),
                time(Some(e.at_ms)),
                format!(
                    "<span data-testid=\"timeline-what\">{}</span>",
                    e.what.as_str()
                ),
                esc(&e.step),
                e.phase.as_str().to_owned(),
                esc(e.key.as_deref().unwrap_or("")),
                e.attempt.map_or_else(String::new, |a| a.to_string()),
                esc(e.detail.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    body.push_str("<h2>Línea de tiempo</h2>\n");
    body.push_str(&table(
        "timeline",
        &[
            "n", "cuándo", "qué", "paso", "fase", "clave", "envío", "detalle",
        ],
        &rows,
        "Sin historia.",
    ));
    page(&format!("Saga {}", record.id), Section::Sagas, &body).into_response()
}

fn bad_request(reason: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        page(
            "Petición no válida",
            Section::Overview,
            &format!("<p class=\"error\" role=\"alert\">{}</p>", esc(reason)),
        ),
    )
        .into_response()
}
