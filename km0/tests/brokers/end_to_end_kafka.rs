//! km0 whole, on an Apache Kafka broker of its own: HTTP → outbox → relay → Kafka →
//! inventario worker → stock, with the services' databases on PostgreSQL and on SQLite.
//! Asserts on rows (`mensajes_procesados`, stock, outbox), on the records in the topics and on
//! the group's committed offsets, read through the broker's inspector.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use entrega::Db;
use entrega_core::headers::{MOTIVO, TIPO};
use entrega_core::{partition_for, NewEvent};
use km0::demo::DemoOptions;
use km0::services::pedidos::{
    AGGREGATE, ORDER_CANCELLED, ORDER_CREATED, ORDER_PAID, PARTITIONS, TOPIC,
};
use km0::wiring::{dead_letter_topic, Components, System};
use serde_json::{json, Value};

use common::kafka_ns::KafkaNamespace;
use common::state::{eventually, order, place, taken, DbState};

/// Orders placed over HTTP; every one is then paid, and every third cancelled.
const ORDERS: usize = 24;

/// A deployment on fresh databases of `backend` with `kafka` as its broker.
fn on_kafka(backend: &str, kafka: &KafkaNamespace) -> System {
    let databases = common::test_system(backend).databases().clone();
    System::new(databases, kafka.url_with("session_timeout_ms=6000"))
        .with_lease_ttl(Duration::from_secs(2))
}

/// Appends further events of order `id` to the pedidos outbox, in one transaction each, as a
/// payment or cancellation service sharing the outbox would.
async fn enqueue(db: &Db, id: &str, kind: &str) {
    let event = NewEvent::new(AGGREGATE, id, kind, json!({"id": id}));
    let mut tx = db.begin().await.unwrap();
    tx.enqueue(&event).await.unwrap();
    tx.commit().await.unwrap();
}

/// The lines of order `n`: one or two products of the seed, never queso-curado (kept for the
/// poison order).
fn lines(n: usize) -> Vec<(&'static str, i64)> {
    const PRODUCTS: [&str; 4] = ["tomate-rosa", "calabacin", "queso-fresco", "vino-crianza"];
    let quantity = i64::try_from(n % 3 + 1).unwrap();
    let mut lines = vec![(PRODUCTS[n % 4], quantity)];
    if n.is_multiple_of(2) {
        lines.push((PRODUCTS[(n + 1) % 4], 1));
    }
    lines
}

async fn orders_flow_through_kafka_once_each_in_order(backend: &str) {
    let kafka = KafkaNamespace::new();
    let system = on_kafka(backend, &kafka);
    let state = DbState::open(&system).await;
    let before = state.stock().await;
    let running = system
        .start(Components::all("kafka-e2e"), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = running.http_addr().unwrap();

    let mut event_ids = BTreeSet::new();
    let mut expected: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut placed: Vec<Vec<(&str, i64)>> = Vec::new();
    for n in 0..ORDERS {
        let id = format!("K-{n:03}");
        let order_lines = lines(n);
        event_ids.insert(place(addr, &order(&id, &order_lines)).await);
        placed.push(order_lines);
        enqueue(&state.pedidos, &id, ORDER_PAID).await;
        let mut kinds = vec![ORDER_CREATED, ORDER_PAID];
        if n.is_multiple_of(3) {
            enqueue(&state.pedidos, &id, ORDER_CANCELLED).await;
            kinds.push(ORDER_CANCELLED);
        }
        expected.insert(id, kinds);
    }
    // More queso-curado than there is: refused for good, dead-lettered, and the rest goes on.
    place(addr, &order("K-poison", &[("queso-curado", 50)])).await;
    expected.insert("K-poison".to_owned(), vec![ORDER_CREATED]);
    let events: i64 = expected.values().map(|k| k.len() as i64).sum();

    eventually(
        Duration::from_secs(90),
        "every event consumed and committed",
        || async { (state.pending().await == 0 && state.consumed_all(events).await).then_some(()) },
    )
    .await;
    running.stop().await.unwrap();

    // Every order applied exactly once: one key per pedido.creado, none for the poison one.
    let keys: BTreeSet<String> = state.keys().await.into_iter().collect();
    assert_eq!(keys, event_ids);
    let orders: Vec<&[(&str, i64)]> = placed.iter().map(Vec::as_slice).collect();
    assert_eq!(state.stock().await, taken(&before, &orders));

    // Per order, its events on one partition (the one Kafka's partitioner gives its key), in
    // the order they were committed to the outbox.
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for record in state.records(TOPIC).await {
        let key = record.key.clone().unwrap();
        assert_eq!(record.partition, partition_for(&key, PARTITIONS), "{key}");
        found
            .entry(key)
            .or_default()
            .push(record.headers.get(TIPO).unwrap().to_owned());
    }
    let expected: BTreeMap<String, Vec<String>> = expected
        .into_iter()
        .map(|(k, kinds)| (k, kinds.into_iter().map(str::to_owned).collect()))
        .collect();
    assert_eq!(found, expected);

    // The group committed every partition to its end.
    let ends = state.end_offsets(TOPIC).await;
    assert_eq!(ends.len(), PARTITIONS as usize);
    let committed = state.committed().await;
    for (partition, end) in &ends {
        if *end > 0 {
            assert_eq!(committed.get(partition), Some(end), "partition {partition}");
        }
    }

    let dead = state.records(&dead_letter_topic()).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].key.as_deref(), Some("K-poison"));
    let reason = dead[0].headers.get(MOTIVO).unwrap_or_default();
    assert!(reason.contains("queso-curado"), "motivo: {reason}");
    let payload: Value = serde_json::from_slice(&dead[0].payload).unwrap();
    assert_eq!(payload["datos"]["id"], "K-poison");

    state.close().await;
    system.destroy().await.unwrap();
}

async fn the_demo_holds_its_invariants_on_kafka(backend: &str, key_concurrency: usize) {
    let kafka = KafkaNamespace::new();
    let system = on_kafka(backend, &kafka).with_key_concurrency(key_concurrency);
    let options = DemoOptions {
        orders: 150,
        concurrency: 8,
        fresh: false,
        keep: true,
        timeout: Duration::from_secs(90),
        seed: 11,
        progress: false,
        redeliver: 10,
        saga: false,
        json: false,
    };
    let report = km0::demo::run(&system, &options).await.unwrap();
    assert!(report.passed(), "{}", report.render());
    assert_eq!(report.consumed, 150);
    assert_eq!(report.redelivered, 10);
    assert_eq!(report.duplicates, 10);
    assert_eq!(report.messages_on_topic, Some(160));
    system.destroy().await.unwrap();
}

mod postgres {
    #[tokio::test]
    async fn orders_flow_through_kafka_once_each_in_order() {
        super::orders_flow_through_kafka_once_each_in_order("postgres").await;
    }

    #[tokio::test]
    async fn the_demo_holds_its_invariants_on_kafka() {
        super::the_demo_holds_its_invariants_on_kafka("postgres", 1).await;
    }

    /// Several orders' events applied at once: still each exactly once.
    #[tokio::test]
    async fn the_demo_holds_its_invariants_on_kafka_with_key_concurrency() {
        super::the_demo_holds_its_invariants_on_kafka("postgres", 8).await;
    }
}

mod sqlite {
    #[tokio::test]
    async fn orders_flow_through_kafka_once_each_in_order() {
        super::orders_flow_through_kafka_once_each_in_order("sqlite").await;
    }
}
