//! `km0 outbox ...`: every service's outbox backlog with the rows the transport refused, and
//! releasing a held row.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use entrega::Db;
use entrega_core::{now_ms, BlockedRow, OutboxStatus, ReleaseError, StoreError};
use uuid::Uuid;

use super::wal_slot;
use crate::wiring::System;

/// `km0 outbox status`: prints every service's backlog as text or, with `json`, as one JSON
/// object (the totals, every refused row, and each service's own figures).
/// On PostgreSQL, each service shows the WAL relay's slots too (`wal_slots` in JSON).
pub async fn status(system: &System, json: bool) -> anyhow::Result<()> {
    // One opening of each database: its backlog and its slots together.
    let all = each_outbox(system, "outbox and WAL slots", async |db: &Db| {
        let status = db.outbox().maintenance.status(now_ms()).await?;
        Ok((status, wal_slot::slots_of(db).await?))
    })
    .await?;
    if json {
        let backlogs: Vec<(&'static str, OutboxStatus)> = all
            .iter()
            .map(|(service, (status, _))| (*service, status.clone()))
            .collect();
        let mut value = all_json(&backlogs);
        for (service, (_, views)) in &all {
            value["services"][*service]["wal_slots"] = wal_slot::to_json(views);
        }
        crate::ops::terminal::println(&value.to_string());
    } else {
        let now = now_ms();
        let text: Vec<String> = all
            .iter()
            .map(|(service, (status, views))| {
                let body = format!("{}{}", render(status, now), wal_slot::render(views));
                format!("{service}\n{}", indent(&body))
            })
            .collect();
        crate::ops::terminal::print(&text.join("\n"));
    }
    Ok(())
}

/// The backlog of every service's outbox, in the order of km0's databases.
pub async fn backlogs(system: &System) -> anyhow::Result<Vec<(&'static str, OutboxStatus)>> {
    each_outbox(system, "outbox", async |db: &Db| {
        db.outbox().maintenance.status(now_ms()).await
    })
    .await
}

/// What `read` finds in each service's database that has an outbox, in the order of km0's
/// databases; `what` names it in errors.
async fn each_outbox<T>(
    system: &System,
    what: &str,
    read: impl AsyncFn(&Db) -> Result<T, StoreError>,
) -> anyhow::Result<Vec<(&'static str, T)>> {
    let mut all = Vec::new();
    for database in crate::wiring::databases().into_iter().filter(|d| d.outbox) {
        let db = system
            .open(database)
            .await
            .with_context(|| format!("opening the {} database", database.name))?;
        let found = read(&db).await;
        db.close().await;
        let found = found.with_context(|| format!("reading the {} {what}", database.name))?;
        all.push((database.name, found));
    }
    Ok(all)
}

/// Every backlog as one JSON object: the totals (the oldest pending age is the largest), every
/// refused row with its service, and each service's figures under `services`.
pub fn all_json(all: &[(&'static str, OutboxStatus)]) -> serde_json::Value {
    let sum = |f: fn(&OutboxStatus) -> u64| all.iter().map(|(_, s)| f(s)).sum::<u64>();
    let blocked: Vec<serde_json::Value> = all
        .iter()
        .flat_map(|(service, status)| {
            blocked_json(status).into_iter().map(move |mut row| {
                row["service"] = serde_json::json!(service);
                row
            })
        })
        .collect();
    let services: serde_json::Map<String, serde_json::Value> = all
        .iter()
        .map(|(service, status)| ((*service).to_owned(), status_json(status)))
        .collect();
    serde_json::json!({
        "pending": sum(|s| s.pending),
        "oldest_pending_age_ms": all.iter().map(|(_, s)| s.oldest_pending_age_ms).max().unwrap_or(0),
        "published": sum(|s| s.published),
        "retrying": sum(|s| s.retrying),
        "held": sum(|s| s.held),
        "blocked": blocked,
        "services": services,
    })
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// `km0 outbox release <id>`: releases one row, audited under the operating-system user; an
/// unknown or not held row is an error and nothing changes.
pub async fn release(system: &System, id: Uuid) -> anyhow::Result<()> {
    let operator = crate::ops::identity::os_user();
    release_row(system, id, &operator)
        .await
        .with_context(|| format!("releasing outbox row {id}"))?;
    println!("released outbox row {id} (by {operator}): the relay tries it again now");
    Ok(())
}

/// Backlog of the pedidos outbox (the console's overview).
pub async fn backlog(system: &System) -> Result<OutboxStatus, StoreError> {
    let store = system.pedidos().await?;
    let status = store.db().outbox().maintenance.status(now_ms()).await;
    store.db().close().await;
    status
}

/// Releases the held outbox row `id`, in whichever service's outbox it is, recorded under
/// `operator` in the same transaction ([`entrega::dlq::release_outbox_row`]).
pub async fn release_row(system: &System, id: Uuid, operator: &str) -> Result<(), ReleaseError> {
    let mut outcome = Err(ReleaseError::UnknownRow { id });
    for database in crate::wiring::databases().into_iter().filter(|d| d.outbox) {
        let db = system.open(database).await?;
        let released = entrega::dlq::release_outbox_row(&db, id, operator).await;
        db.close().await;
        match released {
            Err(ReleaseError::UnknownRow { .. }) => {}
            other => {
                outcome = other;
                break;
            }
        }
    }
    outcome
}

/// `km0 outbox audit`: the latest operator actions on pedidos' outbox, newest first.
pub async fn audit(system: &System, limit: usize, json: bool) -> anyhow::Result<()> {
    let store = system
        .pedidos()
        .await
        .context("opening the pedidos database")?;
    let entries = store.db().dead_letters().audit(limit).await;
    store.db().close().await;
    let entries = entries.context("reading the audit")?;
    crate::ops::terminal::print(&crate::ops::dlq::render_audit(&entries, json)?);
    Ok(())
}

/// The status as JSON: the counts, and each refused row with its attempts, next attempt and
/// holding time in epoch ms, and last error.
pub fn status_json(status: &OutboxStatus) -> serde_json::Value {
    serde_json::json!({
        "pending": status.pending,
        "oldest_pending_age_ms": status.oldest_pending_age_ms,
        "published": status.published,
        "retrying": status.retrying,
        "held": status.held,
        "blocked": status.blocked,
    })
}

/// The refused rows of `status`, each as JSON.
fn blocked_json(status: &OutboxStatus) -> Vec<serde_json::Value> {
    status
        .blocked
        .iter()
        .filter_map(|row| serde_json::to_value(row).ok())
        .collect()
}

fn seconds(ms: i64) -> f64 {
    Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0)).as_secs_f64()
}

/// The status as text: counts, then a table of the refused rows.
pub fn render(status: &OutboxStatus, now_ms: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "pending: {}", status.pending);
    let _ = writeln!(
        out,
        "oldest pending age: {:.3}s",
        seconds(status.oldest_pending_age_ms)
    );
    let _ = writeln!(out, "published (not yet purged): {}", status.published);
    let _ = writeln!(out, "refused, waiting for a retry: {}", status.retrying);
    let _ = writeln!(out, "held (km0 outbox release <id>): {}", status.held);
    if status.blocked.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\n{:<36}  {:<10}  {:<16}  {:<18}  {:>8}  {:<20}  last error",
        "id", "aggregate", "aggregate id", "type", "attempts", "state"
    );
    for row in &status.blocked {
        let _ = writeln!(
            out,
            "{:<36}  {:<10}  {:<16}  {:<18}  {:>8}  {:<20}  {}",
            row.id,
            row.aggregate,
            row.aggregate_id,
            row.kind,
            row.attempts,
            state(row, now_ms),
            row.last_error.as_deref().unwrap_or("")
        );
    }
    out
}

fn state(row: &BlockedRow, now_ms: i64) -> String {
    match (row.held_at_ms, row.next_attempt_ms) {
        (Some(at), _) => format!("held {:.1}s ago", seconds(now_ms - at)),
        (None, Some(next)) if next > now_ms => format!("retry in {:.1}s", seconds(next - now_ms)),
        (None, _) => "retry due".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(held_at_ms: Option<i64>, next_attempt_ms: Option<i64>) -> BlockedRow {
        BlockedRow {
            id: Uuid::nil(),
            aggregate: "pedido".into(),
            aggregate_id: "P-1".into(),
            kind: "pedido.creado".into(),
            attempts: 5,
            next_attempt_ms,
            last_error: Some("message rejected by transport: too large".into()),
            held_at_ms,
        }
    }

    #[test]
    fn the_table_lists_refused_rows_with_their_state() {
        let status = OutboxStatus {
            pending: 3,
            retrying: 1,
            held: 1,
            blocked: vec![row(Some(1_000), None), row(None, Some(12_500))],
            ..OutboxStatus::default()
        };
        let text = render(&status, 11_000);
        assert!(text.contains("held (km0 outbox release <id>): 1"), "{text}");
        assert!(text.contains("held 10.0s ago"), "{text}");
        assert!(text.contains("retry in 1.5s"), "{text}");
        assert!(text.contains("too large"), "{text}");
        let json = status_json(&status);
        assert_eq!(json["held"], 1);
        assert_eq!(json["blocked"][0]["attempts"], 5);
        assert_eq!(json["blocked"][0]["held_at_ms"], 1_000);
        assert!(json["blocked"][1]["held_at_ms"].is_null());
        assert!(!render(&OutboxStatus::default(), 0).contains("last error"));
    }
}
