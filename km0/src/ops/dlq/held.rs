//! `km0 dlq held` and `km0 dlq send-held`: dead letters the broker refused (too large, topic
//! missing), which each consumer holds in its own database (`entrega_held_letters`) so that its
//! partition goes on. Once the cause is mended (the topic created, its size limit raised),
//! `send-held` publishes them to their dead-letter topic and forgets them, audited in that
//! service's database under the operating-system user.

use anyhow::Context as _;
use entrega::dlq::send_held;
use entrega::Db;
use entrega_core::{now_ms, DlqAction, DlqAuditEntry, HeldLetter};
use serde_json::{json, Value};

use super::emit;
use super::time::format_utc;
use crate::ops::identity::os_user;
use crate::wiring::{databases, Database, System};

/// The databases whose consumers may hold refused dead letters: every one with entrega's
/// tables.
pub fn consumers() -> Vec<&'static Database> {
    databases()
        .into_iter()
        .filter(|d| d.entrega_tables)
        .collect()
}

/// Whether the service named `name` keeps held dead letters, as the operations endpoint
/// labels its databases.
pub fn holds_letters(name: &str) -> bool {
    consumers().iter().any(|d| d.name == name)
}

/// Most letters listed or sent per service in one command.
const LIMIT: usize = 1_000;

async fn open(system: &System, database: &Database) -> anyhow::Result<Db> {
    system
        .open(database)
        .await
        .with_context(|| format!("opening the {} database", database.name))
}

fn letter_json(service: &Database, h: &HeldLetter) -> Value {
    json!({
        "service": service.name,
        "group": h.id.group,
        "topic": h.id.topic,
        "partition": h.id.partition,
        "offset": h.id.offset,
        "destination": h.letter.topic,
        "key": h.letter.key,
        "tipo": h.letter.headers.get("tipo"),
        "id_evento": h.letter.headers.get("id_evento"),
        "motivo": h.letter.headers.get("motivo"),
        "bytes": h.letter.payload.len(),
        "refusal": h.refusal,
        "held_at_ms": h.held_at_ms,
        "held_at": format_utc(h.held_at_ms),
    })
}

/// `km0 dlq held`: every held letter of every consumer, oldest first per service.
pub async fn list(system: &System, json: bool) -> anyhow::Result<String> {
    let mut rows = Vec::new();
    for service in consumers() {
        let db = open(system, service).await?;
        let held = db.held_letters().list(LIMIT).await;
        db.close().await;
        let held = held.with_context(|| format!("reading {}'s held letters", service.name))?;
        rows.extend(held.iter().map(|h| letter_json(service, h)));
    }
    emit(json, &rows, |rows| {
        if rows.is_empty() {
            return "no held dead letters\n".to_owned();
        }
        let mut out = String::new();
        for r in rows {
            out.push_str(&format!(
                "{} {}/{}/{} -> {} ({} bytes, held {}): {}\n",
                r["service"].as_str().unwrap_or(""),
                r["topic"].as_str().unwrap_or(""),
                r["partition"],
                r["offset"],
                r["destination"].as_str().unwrap_or(""),
                r["bytes"],
                r["held_at"].as_str().unwrap_or(""),
                r["refusal"].as_str().unwrap_or("")
            ));
        }
        out
    })
}

/// `km0 dlq send-held`: publishes the held letters of `only` (every consumer when `None`)
/// to their dead-letter topics; each confirmed one is forgotten, each refused one stays.
pub async fn send(
    system: &System,
    only: Option<&'static Database>,
    json: bool,
) -> anyhow::Result<String> {
    let broker = system.broker().await.context("opening the broker")?;
    let operator = os_user();
    let mut report = Vec::new();
    for service in consumers()
        .into_iter()
        .filter(|s| only.is_none_or(|o| o == *s))
    {
        let db = open(system, service).await?;
        let outcome = send_one(&db, &broker, &operator).await;
        db.close().await;
        let (sent, refused) =
            outcome.with_context(|| format!("sending {}'s held letters", service.name))?;
        report.push(json!({"service": service.name, "sent": sent, "refused": refused}));
    }
    broker.close().await;
    emit(json, &report, |rows| {
        rows.iter()
            .map(|r| {
                format!(
                    "{}: {} sent, {} refused again\n",
                    r["service"].as_str().unwrap_or(""),
                    r["sent"],
                    r["refused"].as_array().map_or(0, Vec::len)
                )
            })
            .collect()
    })
}

/// Sends one service's held letters and audits the action when there was any to send.
async fn send_one(
    db: &Db,
    broker: &crate::wiring::Broker,
    operator: &str,
) -> anyhow::Result<(usize, Vec<Value>)> {
    let store = db.held_letters();
    let result = send_held(store.as_ref(), broker.publisher().as_ref(), LIMIT).await?;
    let matched = result.sent.len() + result.refused.len();
    let refused: Vec<Value> = result
        .refused
        .iter()
        .map(|(id, why)| json!({"topic": id.topic, "partition": id.partition, "offset": id.offset, "refusal": why}))
        .collect();
    if matched > 0 {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let entry = DlqAuditEntry {
            at_ms: now_ms(),
            operator: operator.to_owned(),
            action: DlqAction::SendHeld,
            filter: String::new(),
            dry_run: false,
            matched: count(matched),
            applied: count(result.sent.len()),
            refused: count(result.refused.len()),
            detail: None,
        };
        db.dead_letters()
            .record(&entry, &[])
            .await
            .context("recording the audit entry")?;
    }
    Ok((result.sent.len(), refused))
}
