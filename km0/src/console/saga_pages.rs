//! The saga pages: order sagas by state, and one saga's timeline with the retry of a
//! compensation that waits for an operator.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use entrega::saga::SagaStatus;

use super::html::{
    bad_request, error_page, esc, failure, page, pager, prose, query_value, short_time, table,
    time, Paging, Section, PER_PAGE,
};
use super::Console;

/// `GET /console/sagas?state=...&page=N`: order sagas, newest first, a page at a time, with
/// the total of the state asked for.
#[utoipa::path(
    get,
    path = "/console/sagas",
    tag = "console",
    params(
        ("state" = Option<String>, Query, description = "Only sagas in this state (also accepted as `estado`)"),
        ("page" = Option<usize>, Query, description = "The page, from 1 (50 sagas a page)"),
    ),
    responses(
        (status = 200, description = "Order sagas, newest first.", content_type = "text/html", body = String),
        (status = 400, description = "An unknown state, or a page that is not one.", content_type = "text/html", body = String),
        (status = 401, description = "From another host, without an operator's token.", body = super::auth::RefusalBody),
        (status = 403, description = "From another host, and no operator is configured.", body = super::auth::RefusalBody),
    )
)]
pub(super) async fn sagas(
    State(console): State<Arc<Console>>,
    Query(mut q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(old) = q.remove("estado") {
        q.entry("state".to_owned()).or_insert(old);
    }
    let status = match q.get("state").map(|s| s.trim()).filter(|s| !s.is_empty()) {
        Some(name) => match SagaStatus::parse(name) {
            Some(status) => Some(status),
            None => return bad_request(&format!("unknown saga state: {name}")),
        },
        None => None,
    };
    let paging = match Paging::from_query(&q) {
        Ok(paging) => paging,
        Err(why) => return bad_request(&why),
    };
    let options: String = std::iter::once("")
        .chain(SagaStatus::ALL.iter().map(|s| s.as_str()))
        .map(|s| {
            let selected = if status.map(SagaStatus::as_str) == Some(s) && !s.is_empty() {
                " selected"
            } else {
                ""
            };
            let label = if s.is_empty() { "any" } else { s };
            format!("<option value=\"{s}\"{selected}>{label}</option>")
        })
        .collect();
    let mut body = format!(
        "<form class=\"filters\" method=\"get\" action=\"/console/sagas\">\
         <label>State <select name=\"state\">{options}</select></label>\
         <button type=\"submit\">Filter</button></form>\n<div class=\"live\" data-refresh=\"5\">\n"
    );
    let total = match console.sagas.counts().await {
        Ok(counts) => Some(
            counts
                .iter()
                .filter(|(s, _)| status.is_none_or(|wanted| wanted == *s))
                .map(|(_, n)| usize::try_from(*n).unwrap_or(0))
                .sum::<usize>(),
        ),
        Err(_) => None,
    };
    match console
        .sagas
        .list_page(status, paging.offset(), PER_PAGE)
        .await
    {
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
                        prose(s.reason.as_deref().unwrap_or("")),
                        short_time(s.created_ms),
                        short_time(s.updated_ms),
                    ]
                })
                .collect();
            body.push_str(&pager(
                "sagas-pager",
                "/console/sagas",
                &q,
                paging,
                rows.len(),
                total,
            ));
            body.push_str(&table(
                "sagas",
                &[
                    "order",
                    "state",
                    "step",
                    "phase",
                    "sends",
                    "reason",
                    "created (UTC)",
                    "changed (UTC)",
                ],
                &rows,
                "No saga.",
            ));
        }
        Err(e) => body.push_str(&failure("the sagas could not be read", &e)),
    }
    body.push_str("</div>\n");
    page("Order sagas", Section::Sagas, &body).into_response()
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
            let message = format!("<p class=\"error\" role=\"alert\">No saga {}</p>", esc(&id));
            return error_page(StatusCode::NOT_FOUND, "Saga", Section::Sagas, &message);
        }
        Err(e) => {
            let message = failure("the saga could not be read", &e);
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
         <dt>order</dt><dd>{}</dd><dt>state</dt><dd data-testid=\"saga-state\">{}</dd>\
         <dt>step</dt><dd>{}</dd><dt>phase</dt><dd>{}</dd><dt>reason</dt><dd>{}</dd>\
         <dt>created</dt><dd>{}</dd><dt>changed</dt><dd>{}</dd></dl>\n\
         <p><a href=\"/console/trace?order={}\">Trace of the order</a></p>\n",
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
             <button type=\"button\" data-action=\"saga-retry\">Retry the compensation</button>\
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
                detail(e.detail.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    body.push_str("<h2>Timeline</h2>\n");
    body.push_str(&table(
        "timeline",
        &[
            "n", "when", "what", "step", "phase", "key", "send", "detail",
        ],
        &rows,
        "No history.",
    ));
    page(&format!("Saga {}", record.id), Section::Sagas, &body).into_response()
}

/// A timeline entry's detail: a JSON object as its fields, one per line (`name: value`), any
/// other text as it is; escaped either way.
fn detail(text: &str) -> String {
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_str::<serde_json::Value>(text)
    else {
        return prose(text);
    };
    fields
        .iter()
        .map(|(name, value)| {
            let value = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            format!(
                "<span class=\"field\"><span class=\"muted\">{}:</span> {}</span>",
                esc(name),
                esc(&value)
            )
        })
        .collect::<Vec<_>>()
        .join("<br>")
        .replace("<span class=\"field\">", "<span class=\"field prose\">")
}

#[cfg(test)]
mod tests {
    use super::detail;

    #[test]
    fn a_json_detail_reads_as_fields_and_anything_else_as_text() {
        let shown = detail(r#"{"motivo":"sin_stock","unidades":3,"x":"<b>"}"#);
        assert!(shown.contains("motivo:</span> sin_stock"), "{shown}");
        assert!(shown.contains("unidades:</span> 3"), "{shown}");
        assert!(shown.contains("&lt;b&gt;"), "{shown}");
        assert!(!shown.contains('{'), "{shown}");
        assert_eq!(
            detail("plain <text>"),
            "<span class=\"prose\">plain &lt;text&gt;</span>"
        );
    }
}
