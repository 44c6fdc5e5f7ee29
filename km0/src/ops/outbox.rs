//! `km0 outbox ...`: the outbox's backlog with the rows the transport refused, and releasing
//! a held row.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use entrega_core::{now_ms, BlockedRow, OutboxStatus, ReleaseError, StoreError};
use uuid::Uuid;

use crate::wiring::System;

/// `km0 outbox status`: prints the backlog as text or, with `json`, as one JSON object.
pub async fn status(system: &System, json: bool) -> anyhow::Result<()> {
    let status = backlog(system).await.context("reading the outbox")?;
    if json {
        crate::ops::terminal::println(&status_json(&status).to_string());
    } else {
        crate::ops::terminal::print(&render(&status, now_ms()));
    }
    Ok(())
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

/// Backlog of the pedidos outbox.
pub async fn backlog(system: &System) -> Result<OutboxStatus, StoreError> {
    let store = system.pedidos().await?;
    let status = store.db().outbox().maintenance.status(now_ms()).await;
    store.db().close().await;
    status
}

/// Releases the parked pedidos outbox row `id`, recorded under `operator` in the same
/// transaction ([`entrega::dlq::release_outbox_row`]).
pub async fn release_row(system: &System, id: Uuid, operator: &str) -> Result<(), ReleaseError> {
    let store = system.pedidos().await?;
    let released = entrega::dlq::release_outbox_row(store.db(), id, operator).await;
    store.db().close().await;
    released
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
