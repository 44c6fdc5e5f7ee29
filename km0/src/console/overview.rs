//! `GET /console/`: the backlog and lag chart, every service's outbox, every consumer group's
//! lag with its live members, the dead letters (pending and held) and the sagas by state,
//! read when the page is asked for (and again as it refreshes itself). A part that cannot be
//! read says so in the page instead of failing it whole.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Html;
use entrega::dlq::DlqFilter;
use entrega::saga::SagaStatus;
use entrega_core::{now_ms, OutboxStatus, StoreError};

use super::history::{chart, Sample};
use super::html::{esc, failure, page, prose, table, thousands, time, Section};
use super::Console;
use crate::ops::lag::lag_report;
use crate::ops::queue_lag::queue_lag_report;

/// Every service's outbox status, in the order of km0's databases.
async fn outboxes(console: &Console) -> Vec<(&'static str, Result<OutboxStatus, StoreError>)> {
    let now = now_ms();
    let mut all = Vec::new();
    for (service, db) in console.outbox_dbs() {
        all.push((service, db.outbox().maintenance.status(now).await));
    }
    all
}

/// One consumer group on one topic, as the overview shows it.
struct GroupRow {
    group: String,
    topic: String,
    /// Live members; `None` when the transport cannot tell.
    members: Option<u32>,
    /// What it has not consumed yet: records (log, Kafka) or ready messages (RabbitMQ).
    behind: u64,
    /// The transport's own detail: partitions behind, or queues and unacknowledged.
    detail: String,
}

/// Every group of km0's components, each once, with its lag.
async fn group_rows(console: &Console) -> Result<Vec<GroupRow>, String> {
    let pairs = crate::ops::lag::km0_groups();
    let mut rows = Vec::new();
    if let Some(amqp) = console.broker.as_amqp() {
        let report = queue_lag_report(amqp, &pairs)
            .await
            .map_err(|e| e.to_string())?;
        for g in report.groups {
            let consumers: u32 = g.queues.iter().map(|q| q.consumers).sum();
            rows.push(GroupRow {
                members: Some(consumers),
                behind: g.ready,
                detail: format!(
                    "{} queue(s), {} unacknowledged, {} dead",
                    g.queues.len(),
                    g.unacked.map_or_else(|| "?".to_owned(), |u| u.to_string()),
                    g.dead_letters.ready
                ),
                group: g.group,
                topic: g.topic,
            });
        }
        return Ok(rows);
    }
    let inspector = console.broker.inspector();
    let report = lag_report(inspector.as_ref(), &pairs)
        .await
        .map_err(|e| e.to_string())?;
    for g in report.groups {
        let behind: Vec<String> = g
            .partitions
            .iter()
            .filter(|p| p.lag > 0)
            .map(|p| format!("p{}: {}", p.partition, p.lag))
            .collect();
        rows.push(GroupRow {
            members: g.members,
            behind: u64::try_from(g.lag).unwrap_or(0),
            detail: if g.partitions.is_empty() {
                "no such topic yet".to_owned()
            } else {
                behind.join(", ")
            },
            group: g.group,
            topic: g.topic,
        });
    }
    Ok(rows)
}

/// The chart's figures now: every outbox's pending rows and every group's lag, summed.
pub(super) async fn sample(console: &Console) -> Sample {
    let outboxes = outboxes(console).await;
    let backlog = outboxes
        .iter()
        .map(|(_, s)| s.as_ref().ok().map(|s| s.pending))
        .sum::<Option<u64>>();
    let lag = group_rows(console)
        .await
        .ok()
        .map(|rows| rows.iter().map(|r| r.behind).sum());
    Sample {
        at_ms: now_ms(),
        backlog,
        lag,
    }
}

/// `GET /console/`: the chart, outboxes, consumer groups, dead letters and sagas at a glance.
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
    console.history.viewed(now_ms());
    let mut body = String::from("<div class=\"live\" data-refresh=\"5\">\n");
    body.push_str("<section><h2>Backlog and lag, last minutes</h2>\n");
    body.push_str(&chart(&console.history.samples()));
    body.push_str("</section>\n<section><h2>Outboxes</h2>\n");
    body.push_str(&outbox_section(&console).await);
    body.push_str("</section>\n<section><h2>Consumer groups</h2>\n");
    body.push_str(&groups_section(&console).await);
    body.push_str("</section>\n<section><h2>Dead letters</h2>\n");
    body.push_str(&dead_letters_section(&console).await);
    body.push_str("</section>\n<section><h2>Order sagas</h2>\n");
    body.push_str(&sagas_section(&console).await);
    body.push_str("</section>\n</div>\n");
    page("Overview", Section::Overview, &body)
}

async fn outbox_section(console: &Console) -> String {
    let all = outboxes(console).await;
    let mut rows = Vec::new();
    let mut blocked = Vec::new();
    let mut out = String::new();
    for (service, status) in &all {
        match status {
            Ok(s) => {
                rows.push(vec![
                    format!("<span data-testid=\"outbox-service\">{service}</span>"),
                    format!(
                        "<span data-testid=\"outbox-pending\">{}</span>",
                        thousands(s.pending as usize)
                    ),
                    format!("{:.1} s", s.oldest_pending_age_ms.max(0) as f64 / 1000.0),
                    s.retrying.to_string(),
                    s.held.to_string(),
                    thousands(s.published as usize),
                ]);
                blocked.extend(s.blocked.iter().map(|r| {
                    vec![
                        (*service).to_owned(),
                        esc(&r.id.to_string()),
                        esc(&r.aggregate_id),
                        esc(&r.kind),
                        r.attempts.to_string(),
                        if r.held_at_ms.is_some() {
                            "held for an operator".to_owned()
                        } else {
                            format!("retry at {}", time(r.next_attempt_ms))
                        },
                        prose(r.last_error.as_deref().unwrap_or("")),
                    ]
                }));
            }
            Err(e) => out.push_str(&failure(
                &format!("{service}'s outbox could not be read"),
                e,
            )),
        }
    }
    out.push_str(&table(
        "outboxes",
        &[
            "service",
            "pending",
            "oldest pending",
            "refused, retrying",
            "held for an operator",
            "published, still kept",
        ],
        &rows,
        "No outbox could be read.",
    ));
    if !blocked.is_empty() {
        out.push_str("<h3>Rows the broker refused</h3>\n");
        out.push_str(&table(
            "outbox-blocked",
            &[
                "service",
                "id",
                "agregado_id",
                "tipo",
                "attempts",
                "state",
                "last error",
            ],
            &blocked,
            "",
        ));
        out.push_str(
            "<p class=\"muted\">Release a held row with <code>km0 outbox release &lt;id&gt;</code>.</p>\n",
        );
    }
    out
}

async fn groups_section(console: &Console) -> String {
    let rows = match group_rows(console).await {
        Ok(rows) => rows,
        Err(e) => return failure("the consumer groups could not be read", &e),
    };
    let amqp = console.broker.is_amqp();
    let cells: Vec<Vec<String>> =
        rows.iter()
            .map(|r| {
                let members = match r.members {
                    Some(0) => "<span class=\"idle\" data-testid=\"group-idle\">not running</span>"
                        .to_owned(),
                    Some(n) => format!("<span data-testid=\"group-members\">{n}</span>"),
                    None => "?".to_owned(),
                };
                vec![
                    format!("<span data-testid=\"group-name\">{}</span>", esc(&r.group)),
                    esc(&r.topic),
                    members,
                    format!(
                        "<span data-testid=\"lag-value\">{}</span>",
                        thousands(r.behind as usize)
                    ),
                    prose(&r.detail),
                ]
            })
            .collect();
    let mut out = table(
        "lag",
        &[
            "group",
            "topic",
            if amqp { "consumers" } else { "members" },
            if amqp { "ready" } else { "lag" },
            if amqp { "queues" } else { "partitions behind" },
        ],
        &cells,
        "No group has a topic yet.",
    );
    if rows.iter().any(|r| r.members == Some(0)) {
        out.push_str(
            "<p class=\"muted\" data-testid=\"idle-note\">A group marked <em>not running</em> \
             has no live member anywhere: this deployment does not run it (the saga and the \
             direct flow use different groups), so its lag only grows.</p>\n",
        );
    }
    out
}

async fn dead_letters_section(console: &Console) -> String {
    let mut out = String::new();
    let place = console.letters.place();
    // On RabbitMQ the queue's depth, which reading no message gives; elsewhere the letters
    // not yet replayed or discarded.
    let pending = match console.broker.as_amqp() {
        Some(amqp) => amqp
            .queue_depths(std::slice::from_ref(&place))
            .await
            .map(|depths| depths.iter().map(|d| d.ready).sum::<u64>() as usize)
            .map_err(|e| e.to_string()),
        None => console
            .letters
            .list(&DlqFilter::all(), false)
            .await
            .map(|letters| letters.len())
            .map_err(|e| e.to_string()),
    };
    match pending {
        Ok(n) => out.push_str(&format!(
            "<p><a href=\"/console/dlq\" data-testid=\"dlq-pending\">{} pending</a> in <code>{}</code></p>\n",
            thousands(n),
            esc(&place)
        )),
        Err(e) => out.push_str(&failure("the dead letters could not be read", &e)),
    }
    let mut held = 0u64;
    let mut unreadable = Vec::new();
    for (service, db) in console.held_dbs() {
        match db.held_letters().count().await {
            Ok(n) => held += n,
            Err(e) => unreadable.push(failure(
                &format!("{service}'s held dead letters could not be read"),
                &e,
            )),
        }
    }
    out.push_str(&format!(
        "<p><a href=\"/console/dlq#held\" data-testid=\"held-count\">{} held</a> in the services' \
         databases (refused by the broker: too large, or no topic)</p>\n",
        thousands(held as usize)
    ));
    out.extend(unreadable);
    out
}

async fn sagas_section(console: &Console) -> String {
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
                            "<a href=\"/console/sagas?state={0}\">{0}</a>",
                            status.as_str()
                        ),
                        thousands(usize::try_from(n).unwrap_or(0)),
                    ]
                })
                .collect();
            table("saga-counts", &["state", "sagas"], &rows, "")
        }
        Err(e) => failure("the sagas could not be read", &e),
    }
}
