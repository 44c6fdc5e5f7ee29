//! What the embedded scenarios share: a database and a log broker in SQLite files of the
//! side's directory, the orders, the seed's choice of the orders a fault hits, the events on
//! the wire, and the effect rows read back.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use entrega::db::{query, Db, Migration};
use entrega::Broker;
use entrega_core::headers::{ID_EVENTO, TIPO};
use entrega_core::{Envelope, Headers, OutgoingMessage};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::SeedableRng;
use serde_json::Value;

use super::Ledger;

/// The topic of `pedido.creado`.
pub(super) const TOPIC: &str = "pedidos.eventos";

/// The stock consumers' effect: one row per unit of stock taken, in the order taken.
pub(super) const STOCK_MOVES: &[Migration] = &[Migration::same(
    1,
    "the lab's stock moves",
    "CREATE TABLE IF NOT EXISTS lab_stock_moves (
         n        INTEGER PRIMARY KEY AUTOINCREMENT,
         order_id TEXT NOT NULL
     );",
)];

/// Runs `side` with the service's database (`<service>.db`) and the log broker (`log.db`)
/// in `dir`, closing both after.
pub(super) async fn with_embedded(
    dir: &Path,
    service: &str,
    side: impl AsyncFnOnce(&Db, &Broker) -> anyhow::Result<Ledger>,
) -> anyhow::Result<Ledger> {
    let db = Db::connect(&format!(
        "sqlite://{}",
        dir.join(format!("{service}.db")).display()
    ))
    .await?;
    let broker = Broker::connect(
        &format!("sqlite://{}", dir.join("log.db").display()),
        Duration::from_secs(10),
    )
    .await?;
    let result = side(&db, &broker).await;
    broker.close().await;
    db.close().await;
    result
}

/// `n` order ids, `P-001` on.
pub(super) fn order_ids(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("P-{i:03}")).collect()
}

/// The `count` of `orders` the seed picks.
pub(super) fn picked(seed: u64, orders: &[String], count: usize) -> HashSet<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    sample(&mut rng, orders.len(), count.min(orders.len()))
        .into_iter()
        .filter_map(|i| orders.get(i).cloned())
        .collect()
}

/// The orders of `set`, sorted, comma-separated.
pub(super) fn listed(set: &HashSet<String>) -> String {
    let mut all: Vec<&str> = set.iter().map(String::as_str).collect();
    all.sort_unstable();
    all.join(", ")
}

/// An event of `kind` keyed by `key` on `topic`, with a fresh `id_evento`.
pub(super) fn event(topic: &str, kind: &str, key: &str, data: Value) -> OutgoingMessage {
    let envelope = Envelope::new(kind, "pedidos", data);
    wire(topic, key, &envelope, envelope.to_bytes())
}

/// `envelope` on `topic` under `key`, its payload as given.
pub(super) fn wire(
    topic: &str,
    key: &str,
    envelope: &Envelope,
    payload: Vec<u8>,
) -> OutgoingMessage {
    OutgoingMessage {
        topic: topic.to_owned(),
        key: Some(key.to_owned()),
        headers: Headers::new()
            .with(TIPO, envelope.kind.as_str())
            .with(ID_EVENTO, envelope.id.to_string()),
        payload,
    }
}

/// The `order_id` of each row of `table`, in the order written (`n`).
pub(super) async fn applied(db: &Db, table: &str) -> anyhow::Result<Vec<String>> {
    Ok(db
        .fetch_all(query(format!("SELECT order_id FROM {table} ORDER BY n")))
        .await?
        .into_iter()
        .map(|(order,): (String,)| order)
        .collect())
}

/// Records of `topic` that `group` has not committed.
pub(super) async fn unread(broker: &Broker, group: &str, topic: &str) -> anyhow::Result<u64> {
    let end: i64 = broker
        .end_offsets(topic)
        .await?
        .iter()
        .map(|(_, e)| e)
        .sum();
    let committed: i64 = broker
        .committed(group, topic)
        .await?
        .iter()
        .map(|(_, c)| c)
        .sum();
    Ok(u64::try_from(end - committed).unwrap_or(0))
}

/// The key of every record of `topic`, in order per partition, as a `read_committed` reader
/// sees them (Kafka hides an aborted transaction's records).
pub(super) async fn keys_on(broker: &Broker, topic: &str) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::new();
    for (partition, end) in broker.end_offsets(topic).await? {
        let mut from = 0;
        while from < end {
            let records = broker.read(topic, partition, from, 500).await?;
            let Some(last) = records.last() else { break };
            from = last.offset + 1;
            keys.extend(records.into_iter().filter_map(|r| r.key));
        }
    }
    Ok(keys)
}
