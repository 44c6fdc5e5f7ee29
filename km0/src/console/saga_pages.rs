//! The saga pages: order sagas by state, and one saga's timeline with the retry of a
//! compensation that waits for an operator.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use entrega::saga::SagaStatus;

use super::html::{bad_request, error_page, esc, failure, page, query_value, table, time, Section};
use super::Console;

/// Most sagas the list shows.
const LIST_LIMIT: usize = 200;

/// `GET /console/sagas?estado=...`: order sagas, newest first.
#[utoipa::path(
    get,
    path = "/console/sagas",
    tag = "console",
    params(("estado" = Option<String>, Query, description = "Only sagas in this state")),
    responses(
        (status = 200, description = "Order sagas, newest first.", content_type = "text/html", body = String),
        (status = 400, description = "An unknown state.", content_type = "text/html", body = String),
        (status = 401, description = "From another host, without an operator's token.", body = super::auth::RefusalBody),
        (status = 403, description = "From another host, and no operator is configured.", body = super::auth::RefusalBody),
    )
)]
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
#[utoipa::path(
    get,
    path = "/console/sagas/{id}",
    tag = "console",
    params(("id" = String, Path, description = "The order")),
    responses(
        (status = 200, description = "One saga and its history.", content_type = "text/html", body = String),
        (status = 404, description = "No such saga.", content_type = "text/html", body = String),
        (status = 401, description = "From another host, without an operator's token.", body = super::auth::RefusalBody),
        (status = 403, description = "From another host, and no operator is configured.", body = super::auth::RefusalBody),
    )
)]
pub(super) async fn saga(State(console): State<Arc<Console>>, Path(id): Path<String>) -> Response {
    let (record, history) = match console.sagas.show(&id).await {
        Ok(Some(found)) => found,
        Ok(None) => {
            let message = format!(
                "<p class=\"error\" role=\"alert\">No hay saga {}</p>",
                esc(&id)
            );
            return error_page(StatusCode::NOT_FOUND, "Saga", Section::Sagas, &message);
        }
        Err(e) => {
            let message = failure("no se pudo leer la saga", &e);
            return error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Saga",
                Section::Sagas,
                &message,
            );
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
