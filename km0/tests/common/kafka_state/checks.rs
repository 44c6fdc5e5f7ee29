//! The end state every Kafka process test must reach, asserted on the databases and on the
//! broker read with the test's own client:
//!
//! - the outbox is drained and the inventario group committed every record of the topic;
//! - every event of every accepted order is in the log, each order's events in the order
//!   they were committed to the outbox (first deliveries: a relay may publish an event twice);
//! - every `pedido.creado` was applied exactly once: one key each in `mensajes_procesados`, no
//!   other key, and the stock is the start less the units of the accepted orders;
//! - within each partition the events were applied in offset order: the transaction that
//!   recorded an event's key (`xmin` of its row, PostgreSQL's transaction id, given out in
//!   order) is never later than the one of the next event of that partition. This is the
//!   consumer's per-partition (hence per-order) order, observed in the rows it wrote;
//! - nothing was dead-lettered.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use entrega::Db;
use km0::services::inventario::{CONSUMER, GROUP};
use km0::services::pedidos::{ORDER_CREATED, TOPIC};
use km0::wiring::dead_letter_topic;

use super::orders::{assert_stock_less, Placed};
use super::{KafkaRecord, KafkaView};
use crate::common::state::{count, DbState};

/// What the log held at the end, for the test's report.
#[derive(Debug, Clone, Copy)]
pub struct LogSummary {
    /// Records of the orders topic.
    pub records: usize,
    /// Records whose `id_evento` came earlier in the log too (published more than once).
    pub republished: usize,
}

/// Transaction id that wrote each key of the stock consumer (PostgreSQL's `xmin`).
async fn key_transactions(inventario: &Db) -> HashMap<String, i64> {
    let Some(pool) = inventario.postgres() else {
        panic!("the Kafka process tests run on PostgreSQL");
    };
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT id_mensaje, CAST(CAST(xmin AS TEXT) AS BIGINT) FROM mensajes_procesados \
         WHERE consumidor = $1",
    )
    .bind(CONSUMER)
    .fetch_all(pool)
    .await
    .expect("keys and their transactions");
    rows.into_iter().collect()
}

/// Whether the outbox is drained and the group committed the whole topic.
pub async fn settled(state: &DbState, view: &KafkaView) -> bool {
    state.pending().await == 0 && view.caught_up(GROUP, TOPIC).await
}

/// Waits up to `limit` for [`settled`]; a timeout names what was still missing: the rows
/// left in the outbox and, per partition, the group's committed offset against the end.
pub async fn wait_settled(state: &DbState, view: &KafkaView, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while !settled(state, view).await {
        if Instant::now() >= deadline {
            panic!(
                "timed out after {limit:?} waiting for {what}: {} outbox rows pending, \
                 committed {:?}, ends {:?}",
                state.pending().await,
                view.committed(GROUP, TOPIC).await,
                view.ends(TOPIC).await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts the end state of the module docs for `placed` orders on a stock that was `start`.
pub async fn assert_applied_exactly_once_in_order(
    state: &DbState,
    view: &KafkaView,
    placed: &[Placed],
    start: &BTreeMap<String, i64>,
) -> LogSummary {
    assert_eq!(state.pending().await, 0, "outbox not drained");
    assert!(
        view.caught_up(GROUP, TOPIC).await,
        "the group did not commit every record: committed {:?}, ends {:?}",
        view.committed(GROUP, TOPIC).await,
        view.ends(TOPIC).await
    );
    let records = view.records(TOPIC).await;
    let summary = assert_log_in_order(&records, placed);

    let transactions = key_transactions(&state.inventario).await;
    let keys: BTreeSet<&str> = transactions.keys().map(String::as_str).collect();
    let created: BTreeSet<&str> = placed.iter().map(Placed::created_id).collect();
    let missing: Vec<_> = created.difference(&keys).collect();
    let unknown: Vec<_> = keys.difference(&created).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{} accepted orders never applied (e.g. {:?}), {} keys of no accepted order (e.g. {:?})",
        missing.len(),
        missing.first(),
        unknown.len(),
        unknown.first()
    );
    assert_eq!(
        state.keys().await.len(),
        placed.len(),
        "one key per pedido.creado"
    );
    assert_stock_less(state, placed, start).await;
    assert_eq!(
        count(&state.pedidos, "SELECT COUNT(*) FROM pedidos").await,
        i64::try_from(placed.len()).expect("count"),
        "orders stored but not accepted, or accepted but not stored"
    );
    assert_applied_in_partition_order(&records, &transactions);
    let dead: i64 = view.ends(&dead_letter_topic()).await.values().sum();
    assert_eq!(dead, 0, "events were dead-lettered");
    eprintln!(
        "{} orders, {} records ({} published more than once), every order applied once",
        placed.len(),
        summary.records,
        summary.republished
    );
    summary
}

/// Every placed event is in the log, each order's first deliveries in enqueue order, all in
/// one partition, and the log holds nothing else.
fn assert_log_in_order(records: &[KafkaRecord], placed: &[Placed]) -> LogSummary {
    let mut seen = HashSet::new();
    let mut republished = 0;
    let mut delivered: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut partitions: HashMap<&str, BTreeSet<u32>> = HashMap::new();
    for r in records {
        let key = r.key.as_deref().expect("records keyed by order id");
        let id = r.id_evento.as_deref().expect("id_evento header");
        partitions.entry(key).or_default().insert(r.partition);
        if seen.insert(id) {
            delivered.entry(key).or_default().push(id);
        } else {
            republished += 1;
        }
    }
    for order in placed {
        let want: Vec<&str> = order.events.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(
            delivered.get(order.order_id.as_str()),
            Some(&want),
            "events of {} missing from the log or out of enqueue order",
            order.order_id
        );
        assert_eq!(
            partitions[order.order_id.as_str()].len(),
            1,
            "events of {} in several partitions",
            order.order_id
        );
    }
    assert_eq!(
        delivered.len(),
        placed.len(),
        "the log holds events of orders never accepted"
    );
    LogSummary {
        records: records.len(),
        republished,
    }
}

/// Within each partition, the first delivery of each `pedido.creado` was applied in a
/// transaction no later than the next one's.
fn assert_applied_in_partition_order(records: &[KafkaRecord], transactions: &HashMap<String, i64>) {
    let mut seen = HashSet::new();
    let mut last: BTreeMap<u32, (i64, i64)> = BTreeMap::new();
    for r in records {
        let Some(id) = r.id_evento.as_deref() else {
            continue;
        };
        if r.tipo.as_deref() != Some(ORDER_CREATED) || !seen.insert(id) {
            continue;
        }
        let xid = transactions[id];
        if let Some((offset, before)) = last.get(&r.partition) {
            assert!(
                *before <= xid,
                "partition {}: the event at offset {} was applied (transaction {xid}) before \
                 the one at offset {offset} (transaction {before})",
                r.partition,
                r.offset
            );
        }
        last.insert(r.partition, (r.offset, xid));
    }
}
