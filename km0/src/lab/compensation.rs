//! Scenario 9: a saga's compensation delivered twice, on the embedded default. Cancelled
//! orders give their reserved stock back (`inventario.liberar`, key `liberacion-<pedido>`).
//! The orchestrator sends some releases again after its timer fired while the first was on
//! its way: a resend is a new message (a new `id_evento`) with the same key (`clave`).
//!
//! The naive inventario deduplicates by `id_evento`, as a consumer of events does; the pattern
//! deduplicates a command by its deterministic key.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use entrega::db::{query, Db, Migration};
use entrega::{Broker, MigrationSet};
use entrega_core::{Envelope, OutgoingMessage};
use serde_json::json;

use super::embedded::{applied, event, listed, order_ids, picked, with_embedded};
use super::{Ledger, Side, SideRun};

/// Cancelled orders whose stock comes back.
const ORDERS: usize = 30;
/// Releases sent twice.
const RESENT: usize = 3;
const TOPIC: &str = "inventario.comandos";
const GROUP: &str = "lab.inventario";
const CONSUMER: &str = "lab.liberacion";
const WITHIN: Duration = Duration::from_secs(30);

/// The effect: one row per release applied, in order.
const TABLES: &[Migration] = &[Migration::same(
    1,
    "the lab's stock releases",
    "CREATE TABLE IF NOT EXISTS lab_releases (
         n        INTEGER PRIMARY KEY AUTOINCREMENT,
         order_id TEXT NOT NULL,
         units    INTEGER NOT NULL
     );",
)];

/// Runs one side in `dir` (created empty by the caller).
pub(super) async fn run(r: &SideRun) -> anyhow::Result<Ledger> {
    let (dir, seed, side) = (r.dir.as_path(), r.seed, r.side);
    with_embedded(dir, "inventario", async |db, broker| {
        run_on(db, broker, seed, side).await
    })
    .await
}

fn release(order: &str) -> OutgoingMessage {
    // Each send is a message of its own: a new id_evento, the same key.
    let data = json!({"pedido_id": order, "clave": format!("liberacion-{order}"), "unidades": 2});
    event(TOPIC, "inventario.liberar", order, data)
}

async fn run_on(db: &Db, broker: &Broker, seed: u64, side: Side) -> anyhow::Result<Ledger> {
    db.migrate(&[MigrationSet::Inbox]).await?;
    db.apply_migrations("lab", TABLES).await?;
    broker.admin().ensure_topic(TOPIC, 1).await?;
    let orders = order_ids(ORDERS);
    let resent = picked(seed, &orders, RESENT);
    let mut messages: Vec<OutgoingMessage> = orders.iter().map(|o| release(o)).collect();
    // The timer's resends, after the first sends.
    let mut again: Vec<&String> = resent.iter().collect();
    again.sort();
    messages.extend(again.iter().map(|o| release(o)));
    broker.publisher().publish(&messages).await?;
    let sent = messages.len();

    let mut sub = broker.subscriber().subscribe(GROUP, TOPIC, "lab-0").await?;
    let deadline = Instant::now() + WITHIN;
    let mut handled = 0;
    while handled < sent && Instant::now() < deadline {
        for record in sub.poll(50, Duration::from_millis(100)).await? {
            let envelope = Envelope::parse(&record.payload).context("the lab's own command")?;
            let order = envelope.data["pedido_id"].as_str().unwrap_or_default();
            let units = envelope.data["unidades"].as_i64().unwrap_or(0);
            let key = match side {
                Side::Naive => envelope.id.to_string(),
                Side::Pattern => envelope.data["clave"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            };
            let mut tx = db.begin().await?;
            if tx.claim(CONSUMER, &key).await? {
                tx.execute(
                    query("INSERT INTO lab_releases (order_id, units) VALUES ($1, $2)")
                        .bind(order)
                        .bind(units),
                )
                .await?;
            }
            tx.commit().await?;
            sub.commit(&[(record.partition, record.offset + 1)]).await?;
            handled += 1;
        }
    }
    sub.close().await?;
    let mut ledger = Ledger::from_effects(&orders, &applied(db, "lab_releases").await?);
    ledger.stuck = u64::try_from(sent.saturating_sub(handled))?;
    ledger.fault = format!(
        "the orchestrator's timer sent {RESENT} releases again while the first were on their \
         way (orders {}): new id_evento, same clave",
        listed(&resent)
    );
    Ok(ledger)
}
