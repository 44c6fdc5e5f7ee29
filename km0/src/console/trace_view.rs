//! `GET /console/trace?order=<id>`: one order across the services. Every outbox row any
//! service wrote about it (in each service's own database), with the trace and span it
//! carries (`headers`), in the order they were written; the trace ids found; its saga; and
//! its dead letters.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Html;
use entrega::db::query;
use entrega::dlq::DlqFilter;
use entrega_core::{Headers, TraceContext, TRACEPARENT};

use super::html::{esc, failure, prose, query_value, table, Section};
use super::Console;

/// Most rows read from one service's outbox for one order.
const ROWS_PER_SERVICE: i64 = 500;

/// An outbox row as read: tipo, agregado_id, creado_en, publicado_en, headers.
type StoredRow = (String, String, String, Option<String>, Option<String>);

/// One outbox row about the order.
struct Row {
    service: &'static str,
    created: String,
    published: Option<String>,
    kind: String,
    aggregate_id: String,
    trace: Option<TraceContext>,
}

pub(super) async fn page_for(console: &Console, order: &str) -> String {
    let mut rows: Vec<Row> = Vec::new();
    let mut notes = String::new();
    // `\` escapes LIKE's wildcards in the id on both backends.
    let pattern = format!(
        "%\"{}\"%",
        order
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    for (service, db) in console.outbox_dbs() {
        let found: Result<Vec<StoredRow>, _> = db
            .fetch_all(
                query(
                    "SELECT tipo, agregado_id, CAST(creado_en AS TEXT), \
                            CAST(publicado_en AS TEXT), CAST(headers AS TEXT) \
                     FROM outbox \
                     WHERE agregado_id = $1 OR CAST(carga AS TEXT) LIKE $2 ESCAPE '\\' \
                     ORDER BY creado_en LIMIT $3",
                )
                .bind(order)
                .bind(pattern.as_str())
                .bind(ROWS_PER_SERVICE),
            )
            .await;
        match found {
            Ok(found) => rows.extend(found.into_iter().map(
                |(kind, aggregate_id, created, published, headers)| Row {
                    service,
                    created,
                    published,
                    kind,
                    aggregate_id,
                    trace: headers.and_then(|h| {
                        Headers::from_json_object(&h)
                            .get(TRACEPARENT)
                            .and_then(|t| TraceContext::parse(t).ok())
                    }),
                },
            )),
            Err(e) => notes.push_str(&failure(
                &format!("{service}'s outbox could not be read"),
                &e,
            )),
        }
    }
    rows.sort_by(|a, b| a.created.cmp(&b.created));
    let mut traces: BTreeMap<String, usize> = BTreeMap::new();
    for r in &rows {
        let key = r
            .trace
            .map_or_else(|| "(no trace)".to_owned(), |t| t.trace_id());
        *traces.entry(key).or_default() += 1;
    }
    let mut body = notes;
    let summary: Vec<Vec<String>> = traces
        .iter()
        .map(|(t, n)| {
            vec![
                format!("<code data-testid=\"trace-id\">{}</code>", esc(t)),
                n.to_string(),
            ]
        })
        .collect();
    body.push_str("<h2>Traces</h2>\n");
    body.push_str(&table(
        "traces",
        &["trace", "events"],
        &summary,
        "No event of this order.",
    ));
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                esc(&r.created),
                format!("<span data-testid=\"trace-service\">{}</span>", r.service),
                esc(&r.kind),
                esc(&r.aggregate_id),
                esc(r.published.as_deref().unwrap_or("pending")),
                r.trace
                    .map_or_else(String::new, |t| format!("<code>{}</code>", t.trace_id())),
                r.trace
                    .map_or_else(String::new, |t| format!("<code>{}</code>", t.span_id())),
            ]
        })
        .collect();
    body.push_str("<h2>Events, in the order they were written</h2>\n");
    body.push_str(&table(
        "trace-events",
        &[
            "written",
            "service",
            "tipo",
            "agregado_id",
            "published",
            "trace",
            "span",
        ],
        &table_rows,
        "No service wrote an event about this order.",
    ));
    match console.sagas.show(order).await {
        Ok(Some((saga, history))) => body.push_str(&format!(
            "<p>Saga: <a href=\"/console/sagas/{}\">{}</a>, {} entries in its history</p>\n",
            query_value(&saga.id),
            saga.status.as_str(),
            history.len()
        )),
        Ok(None) => body.push_str("<p>No saga.</p>\n"),
        Err(e) => body.push_str(&failure("the saga could not be read", &e)),
    }
    match console.letters.list(&DlqFilter::all(), true).await {
        Ok(letters) => {
            let mine: Vec<Vec<String>> = letters
                .iter()
                .filter(|l| l.key.as_deref() == Some(order))
                .map(|l| {
                    let id = l.id.to_string();
                    vec![
                        format!(
                            "<a href=\"/console/dlq/letter?id={}\">{}</a>",
                            query_value(&id),
                            esc(&id)
                        ),
                        esc(l.kind.as_deref().unwrap_or("")),
                        prose(&l.reason),
                        l.state().to_owned(),
                    ]
                })
                .collect();
            body.push_str("<h2>Dead letters</h2>\n");
            body.push_str(&table(
                "trace-dlq",
                &["id", "tipo", "reason", "state"],
                &mine,
                "None.",
            ));
        }
        Err(e) => body.push_str(&failure("the dead letters could not be read", &e)),
    }
    body
}

/// The page: a form for the order id, and what [`page_for`] finds.
#[utoipa::path(
    get,
    path = "/console/trace",
    tag = "console",
    params(("order" = Option<String>, Query, description = "The order whose trace to show (also accepted as `pedido`)")),
    responses(
        (status = 200, description = "An order's trace across the services.", content_type = "text/html", body = String),
        (status = 401, description = "From another host, without an operator's token.", body = super::auth::RefusalBody),
        (status = 403, description = "From another host, and no operator is configured.", body = super::auth::RefusalBody),
    )
)]
pub(super) async fn page(
    State(console): State<Arc<Console>>,
    Query(q): Query<HashMap<String, String>>,
) -> Html<String> {
    let order = q
        .get("order")
        .or_else(|| q.get("pedido"))
        .map(|p| p.trim())
        .filter(|p| !p.is_empty());
    let mut body = format!(
        "<form class=\"filters\" method=\"get\" action=\"/console/trace\">\
         <label>Order <input name=\"order\" value=\"{}\"></label>\
         <button type=\"submit\">Find</button></form>\n",
        esc(order.unwrap_or(""))
    );
    if let Some(order) = order {
        body.push_str(&page_for(&console, order).await);
    }
    super::html::page("Trace of an order", Section::Trace, &body)
}
