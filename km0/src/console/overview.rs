//! `GET /console/`: pedidos' outbox, every consumer group's lag, the pending dead letters and
//! the sagas by state, read when the page is asked for. A part that cannot be read says so in
//! the page instead of failing it whole.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Html;
use entrega::dlq::DlqFilter;
use entrega::saga::SagaStatus;

use super::html::{esc, failure, page, table, time, Section};
use super::Console;
use crate::ops::lag::lag_report;
use crate::ops::queue_lag::queue_lag_report;
use crate::wiring::groups;

/// `GET /console/`: outbox, consumer lag, dead letters and sagas at a glance.
#[utoipa::path(
    get,
    path = "/console",
    tag = "console",
    responses(
        (status = 200, description = "The overview page.", content_type = "text/html", body = String),
        (status = 401, description = "From another host, without an operator's token.", body = super::auth::RefusalBody),
        (status = 403, description = "From another host, and no operator is configured.", body = super::auth::RefusalBody),
    )
)]
pub(super) async fn overview(State(console): State<Arc<Console>>) -> Html<String> {
    let mut body = String::new();
    body.push_str("<section><h2>Outbox de pedidos</h2>\n");
    match crate::ops::outbox::backlog(&console.system).await {
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
        for owned in groups() {
            let (group, topic) = (owned.group, owned.topic);
            match queue_lag_report(amqp, &[(group.to_owned(), topic.to_owned())]).await {
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
    for owned in groups() {
        let (group, topic) = (owned.group, owned.topic);
        match lag_report(inspector.as_ref(), &[(group.to_owned(), topic.to_owned())]).await {
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
