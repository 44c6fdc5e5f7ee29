//! Interop with services written as in the seed (Python, `confluent_kafka` + `psycopg` 3,
//! scripts in `interop/`), over the suite's Kafka under a namespace of the test's own (the
//! scripts are given the topics and groups as the broker names them):
//!
//! - ours → seed: km0's pedidos and relay publish; the seed's idempotent consumer parses our
//!   envelopes and applies each `pedido.creado` once in its own database;
//! - seed → ours: the seed's `crear_pedido` and polling relay publish, the relay dying once
//!   between flush and mark so every event is on the topic twice; km0's inventario applies
//!   each once.
//!
//! The Python interpreter is `KM0_INTEROP_PYTHON`, or the venv `scripts/lib/python.sh`
//! provisions; a test fails (never skips) when there is none.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use std::collections::BTreeMap;
use std::time::Duration;

use km0::services::inventario::{CONSUMER, GROUP, INITIAL_STOCK};
use km0::services::pedidos::TOPIC;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::interop::km0_kafka::{Databases, Km0Kafka};
use crate::interop::python::{argv, caught_up, dead_letters, run_ok, run_script, topic_stats};
use common::kafka_ns::KafkaNamespace;
use common::state::{eventually, order, place, taken};

/// Longest wait for km0 to apply what is on the topic.
const CONSUMED_WITHIN: Duration = Duration::from_secs(120);
/// Exit status of `seed_relay.py --crash-before-mark` when it dies after the flush.
const RELAY_CRASHED: i32 = 3;

async fn stock(pool: &PgPool) -> BTreeMap<String, i64> {
    sqlx::query_as("SELECT producto, unidades::BIGINT FROM stock")
        .fetch_all(pool)
        .await
        .expect("stock")
        .into_iter()
        .collect()
}

async fn processed_keys(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT id_mensaje FROM mensajes_procesados WHERE consumidor = $1 ORDER BY id_mensaje",
    )
    .bind(CONSUMER)
    .fetch_all(pool)
    .await
    .expect("processed keys")
}

async fn outbox_ids(pool: &PgPool, orders: &[String]) -> Vec<String> {
    sqlx::query_scalar("SELECT id::TEXT FROM outbox WHERE agregado_id = ANY($1) ORDER BY id::TEXT")
        .bind(orders)
        .fetch_all(pool)
        .await
        .expect("outbox ids")
}

async fn pending(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE publicado_en IS NULL")
        .fetch_one(pool)
        .await
        .expect("pending rows")
}

fn initial_stock() -> BTreeMap<String, i64> {
    INITIAL_STOCK
        .iter()
        .map(|(p, u)| ((*p).to_owned(), *u))
        .collect()
}

/// The lines of order `i` of the ours → seed test.
fn lines_of(i: i64) -> Vec<(&'static str, i64)> {
    let mut lines = vec![("tomate-rosa", 1 + i % 3)];
    if i % 3 == 0 {
        lines.push(("calabacin", 2));
    }
    lines
}

#[tokio::test]
async fn the_seeds_idempotent_consumer_applies_each_km0_event_once() {
    const ORDERS: i64 = 12;
    let broker = KafkaNamespace::new();
    let km0 = Km0Kafka::new(&broker);
    let mut dbs = Databases::new();
    let pedidos_db = km0.db(&mut dbs, "pedidos").await;
    let seed_url = dbs
        .create(&format!("entrega_t_{}_seed", uuid::Uuid::new_v4().simple()))
        .await;
    let pedidos = km0.start("pedidos").await;
    let relay = km0.start("relay").await;

    let order_ids: Vec<String> = (1..=ORDERS).map(|i| format!("P-INTEROP-{i:03}")).collect();
    let mut placed = Vec::new();
    for (i, id) in (1..=ORDERS).zip(&order_ids) {
        placed.push(place(pedidos.http_addr(), &order(id, &lines_of(i))).await);
    }
    placed.sort();

    let bootstrap = broker.bootstrap();
    let group = format!("seed-{}", uuid::Uuid::new_v4().simple());
    let args = format!(
        "--bootstrap {bootstrap} --dsn {seed_url} --topic {} --group {} \
         --expect {ORDERS} --timeout 90",
        broker.wire(TOPIC),
        broker.wire(&group)
    );
    let summary = run_ok("seed_consumer.py", &argv(&args)).await;
    assert_eq!(summary["invalid"], 0, "{summary}");
    assert_eq!(summary["processed"], ORDERS, "{summary}");

    // The seed's table holds exactly the ids of our outbox rows, each once.
    let seed = PgPool::connect(&seed_url).await.expect("seed database");
    let keys = processed_keys(&seed).await;
    assert_eq!(
        keys, placed,
        "one key per placed order, as the API answered"
    );
    assert_eq!(keys, outbox_ids(&pedidos_db, &order_ids).await);
    // What the seed's consumer read was km0's version 2, the seed's envelope example.
    let versions: Vec<i32> = sqlx::query_scalar(
        "SELECT DISTINCT version FROM outbox WHERE agregado_id = ANY($1) AND tipo = 'pedido.creado'",
    )
    .bind(&order_ids)
    .fetch_all(&pedidos_db)
    .await
    .expect("versions");
    assert_eq!(versions, [2]);
    // And the seed's stock UPDATE took exactly the ordered units.
    let lines: Vec<Vec<(&str, i64)>> = (1..=ORDERS).map(lines_of).collect();
    let lines: Vec<&[(&str, i64)]> = lines.iter().map(Vec::as_slice).collect();
    assert_eq!(stock(&seed).await, taken(&initial_stock(), &lines));
    // The topic carries our events and nothing else.
    let stats = topic_stats(&broker, TOPIC, &group).await;
    assert_eq!(stats["distinct_ids"], ORDERS, "{stats}");

    relay.terminate().await;
    pedidos.terminate().await;
    seed.close().await;
    pedidos_db.close().await;
}

#[tokio::test]
async fn km0_inventario_applies_the_seed_relays_events_once_though_the_relay_died_unmarked() {
    const ORDERS: i64 = 15;
    let broker = KafkaNamespace::new();
    let km0 = Km0Kafka::new(&broker);
    let mut dbs = Databases::new();
    let inventario_db = km0.db(&mut dbs, "inventario").await;
    let _pedidos_db = km0.db(&mut dbs, "pedidos").await;
    let seed_url = dbs
        .create(&format!("entrega_t_{}_seed", uuid::Uuid::new_v4().simple()))
        .await;

    let bootstrap = broker.bootstrap();
    let relay = argv(&format!(
        "--bootstrap {bootstrap} --dsn {seed_url} --topic {} --orders {ORDERS}",
        broker.wire(TOPIC)
    ));
    // First pass: orders created, events published and flushed, then death before the mark.
    let crash = [&relay[..], &argv("--crash-before-mark")].concat();
    let crashed = run_script("seed_relay.py", &crash).await;
    assert_eq!(
        crashed.status.code(),
        Some(RELAY_CRASHED),
        "{}",
        crashed.stderr
    );
    let seed = PgPool::connect(&seed_url).await.expect("seed database");
    assert_eq!(
        pending(&seed).await,
        ORDERS,
        "the crash left every row unmarked"
    );
    // Second pass publishes them all again, with the same id_evento, and marks them.
    let summary = run_ok("seed_relay.py", &relay).await;
    assert_eq!(summary["created"], 0, "{summary}");
    assert_eq!(summary["published"], ORDERS, "{summary}");
    assert_eq!(pending(&seed).await, 0);
    let stats = topic_stats(&broker, TOPIC, GROUP).await;
    assert_eq!(stats["messages"], 2 * ORDERS, "{stats}");
    assert_eq!(stats["distinct_ids"], ORDERS, "{stats}");

    let inventario = km0.start("inventario").await;
    eventually(
        CONSUMED_WITHIN,
        "km0 inventario to commit every message",
        || async { caught_up(&topic_stats(&broker, TOPIC, GROUP).await).then_some(()) },
    )
    .await;

    let order_ids: Vec<String> = (1..=ORDERS).map(|i| format!("P-2026-{i:06}")).collect();
    let seed_ids = outbox_ids(&seed, &order_ids).await;
    assert_eq!(seed_ids.len(), usize::try_from(ORDERS).unwrap());
    assert_eq!(
        processed_keys(&inventario_db).await,
        seed_ids,
        "each seed event applied once"
    );
    let ordered: Vec<(String, i64)> = sqlx::query_as(
        "SELECT producto, SUM(cantidad)::BIGINT FROM lineas_pedido GROUP BY producto",
    )
    .fetch_all(&seed)
    .await
    .expect("ordered units");
    let mut expected = initial_stock();
    for (product, units) in ordered {
        *expected.get_mut(&product).expect("known product") -= units;
    }
    assert_eq!(stock(&inventario_db).await, expected, "units taken once");
    assert_eq!(
        dead_letters(&broker).await,
        0,
        "duplicates are acknowledged, not dead"
    );

    inventario.terminate().await;
    seed.close().await;
    inventario_db.close().await;
}

/// One message published as given, then `seed_consumer.py --expect 1` on its own topic,
/// group and database; asserts the exit status and the state it left.
async fn consume_one(broker: &KafkaNamespace, n: usize, dsn: &str, case: &Case) {
    let (what, exit) = (case.what, case.exit);
    let bootstrap = broker.bootstrap();
    let (topic, group) = (format!("{TOPIC}.raw{n}"), format!("raw-{n}"));
    let (wire_topic, wire_group) = (broker.wire(&topic), broker.wire(&group));
    let mut raw = argv(&format!(
        "--bootstrap {bootstrap} --topic {wire_topic} --key P-RAW-1 \
         --header tipo=pedido.creado --header id_evento={}",
        case.header
    ));
    raw.extend(["--value".to_owned(), case.value.clone()]);
    run_ok("produce_raw.py", &raw).await;
    let consumer = argv(&format!(
        "--bootstrap {bootstrap} --dsn {dsn} --topic {wire_topic} --group {wire_group} \
         --expect 1 --timeout 60"
    ));
    let ran = run_script("seed_consumer.py", &consumer).await;
    let out = format!("{what}: {}\n{}", ran.summary, ran.stderr);
    assert_eq!(ran.status.code(), Some(exit), "{out}");
    let db = PgPool::connect(dsn).await.expect("consumer database");
    let keys = processed_keys(&db).await;
    let stats = topic_stats(broker, &topic, &group).await;
    if exit == 0 {
        assert_eq!(keys, vec![case.header.clone()], "{out}");
        assert!(caught_up(&stats), "{what}: committed: {stats}");
    } else {
        assert_eq!(ran.summary["invalid"], 1, "{out}");
        assert!(keys.is_empty(), "{what}: nothing applied");
        assert_eq!(stock(&db).await, initial_stock(), "{what}");
        assert!(!caught_up(&stats), "{what}: left uncommitted: {stats}");
    }
    db.close().await;
}

/// A message for [`consume_one`]: its value, its `id_evento` header, the expected exit.
struct Case {
    what: &'static str,
    value: String,
    header: String,
    exit: i32,
}

/// The seed consumer's envelope check is live: the intact event is applied and committed;
/// each broken copy is refused (exit 2), applies nothing and stays uncommitted.
#[tokio::test]
async fn the_seed_consumer_refuses_envelopes_that_break_the_contract() {
    let broker = KafkaNamespace::new();
    let id = uuid::Uuid::new_v4().to_string();
    let upper = id.to_uppercase();
    let envelope = |id_evento: &str, version: Value| {
        json!({"id_evento": id_evento, "tipo": "pedido.creado", "version": version,
               "fecha_ms": 1_767_225_600_000_i64, "origen": "pedidos",
               "datos": {"id": "P-RAW-1", "lineas": [{"producto": "calabacin", "cantidad": 1}]}})
        .to_string()
    };
    let case = |what, value, header: &str, exit| Case {
        what,
        value,
        header: header.to_owned(),
        exit,
    };
    let other = uuid::Uuid::new_v4().to_string();
    let cases = [
        case("intact", envelope(&id, json!(1)), &id, 0),
        case(
            "header id_evento differs",
            envelope(&id, json!(1)),
            &other,
            2,
        ),
        case("version is text", envelope(&id, json!("1")), &id, 2),
        case("uuid not canonical", envelope(&upper, json!(1)), &upper, 2),
    ];
    let mut dbs = Databases::new();
    let mut dsns = Vec::new();
    for _ in &cases {
        let name = format!("entrega_t_{}_raw", uuid::Uuid::new_v4().simple());
        dsns.push(dbs.create(&name).await);
    }
    // Independent topics, groups and databases: the cases run side by side.
    futures::future::join_all(
        cases
            .iter()
            .zip(&dsns)
            .enumerate()
            .map(|(n, (case, dsn))| consume_one(&broker, n, dsn, case)),
    )
    .await;
}

/// The seed's own `crear_pedido` (its INSERT into the outbox, no column of entrega's named)
/// writes into km0's pedidos database while km0's WAL relay streams from its slot: every row
/// is decoded, published and marked, and km0's inventario applies each order once.
#[tokio::test]
async fn the_wal_relay_publishes_the_seeds_own_inserts() {
    const ORDERS: i64 = 20;
    let broker = KafkaNamespace::new();
    let km0 = Km0Kafka::new(&broker);
    let mut dbs = Databases::new();
    let pedidos_db = km0.db(&mut dbs, "pedidos").await;
    let inventario_db = km0.db(&mut dbs, "inventario").await;
    let relay = km0
        .start_with("relay", &[("KM0_RELAY_SOURCE", "wal")])
        .await;
    let inventario = km0.start("inventario").await;
    eventually(CONSUMED_WITHIN, "the WAL relay streaming", || async {
        let active: Option<bool> = sqlx::query_scalar(
            "SELECT active FROM pg_replication_slots WHERE database = current_database()",
        )
        .fetch_optional(&pedidos_db)
        .await
        .expect("slot");
        (active == Some(true)).then_some(())
    })
    .await;

    let pedidos_url = km0.url("pedidos").await;
    let created = run_ok(
        "seed_producer.py",
        &argv(&format!(
            "--dsn {pedidos_url} --orders {ORDERS} --id-prefix P-WAL-"
        )),
    )
    .await;
    assert_eq!(created["created"], ORDERS, "{created}");
    eventually(
        CONSUMED_WITHIN,
        "every seed row marked published",
        || async { (pending(&pedidos_db).await == 0).then_some(()) },
    )
    .await;
    eventually(
        CONSUMED_WITHIN,
        "km0 inventario to commit every message",
        || async { caught_up(&topic_stats(&broker, TOPIC, GROUP).await).then_some(()) },
    )
    .await;
    let order_ids: Vec<String> = (1..=ORDERS).map(|i| format!("P-WAL-{i:06}")).collect();
    let seed_ids = outbox_ids(&pedidos_db, &order_ids).await;
    assert_eq!(seed_ids.len(), usize::try_from(ORDERS).unwrap());
    assert_eq!(
        processed_keys(&inventario_db).await,
        seed_ids,
        "each of the seed's rows applied once"
    );
    let stats = topic_stats(&broker, TOPIC, GROUP).await;
    assert_eq!(stats["distinct_ids"], ORDERS, "{stats}");

    inventario.terminate().await;
    relay.terminate().await;
    pedidos_db.close().await;
    inventario_db.close().await;
}
