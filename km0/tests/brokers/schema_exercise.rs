//! The seed's exercise 3.3, end to end, on an Apache Kafka broker of the test's own: the
//! seed's own pedidos and relay (Python, `interop/seed_relay.py`) publish `pedido.creado`
//! version 1; a consumer written for version 2 only (km0's contract type
//! `contracts::orders::OrderCreated`) cannot read them, and each one becomes a dead letter
//! with motivo `esquema` naming the versions, never retried; the consumer is deployed again
//! with km0's upcasters (version 1 → 2); `km0 dlq replay --motivo esquema` sends the letters
//! back, and each order is applied exactly once, also when the replay is asked for twice.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use async_trait::async_trait;
use entrega::db::{query, Db, Migration};
use entrega::{Apply, HandlerError, Idempotent, Message, MigrationSet, Tx, Upcasters};
use entrega_core::headers::MOTIVO;
use entrega_core::Record;
use km0::contracts::orders::OrderCreated;
use km0::services::pedidos::TOPIC;
use km0::wiring::config::{DataPlace, Databases as Km0Databases};
use km0::wiring::{consumer_worker, dead_letter_topic, ensure_topics, Broker, System};
use serde_json::Value;
use sqlx::{PgPool, SqlitePool};
use tokio_util::sync::CancellationToken;

use crate::common::kafka_ns::KafkaNamespace;
use crate::common::state::eventually;
use crate::interop::km0_kafka::Databases;
use crate::interop::python::{argv, run_ok};

const ORDERS: i64 = 6;
const PATIENCE: Duration = Duration::from_secs(90);
const REPLAY_KEY: &str = "schema-exercise-replay-key";
/// The consumer's name in `mensajes_procesados`.
const CONSUMER: &str = "ejercicio.ventas_v2";

const TABLES: &[Migration] = &[Migration::same(
    1,
    "ventas_v2",
    "CREATE TABLE IF NOT EXISTS ventas_v2 (pedido_id TEXT PRIMARY KEY, cliente TEXT NOT NULL, \
     lineas INTEGER NOT NULL, veces INTEGER NOT NULL DEFAULT 1)",
)];

/// Written against `pedido.creado` version 2: one row per order; a second application of
/// the same order would count up `veces`.
struct RecordOrder;

#[async_trait]
impl Apply<OrderCreated> for RecordOrder {
    async fn apply(
        &self,
        tx: &mut Tx,
        order: OrderCreated,
        _: &Message,
    ) -> Result<(), HandlerError> {
        let lines = i64::try_from(order.lines.len()).unwrap_or(i64::MAX);
        tx.execute(
            query(
                "INSERT INTO ventas_v2 (pedido_id, cliente, lineas) VALUES ($1, $2, $3) \
                 ON CONFLICT (pedido_id) DO UPDATE SET veces = ventas_v2.veces + 1",
            )
            .bind(order.id)
            .bind(order.customer)
            .bind(lines),
        )
        .await?;
        Ok(())
    }
}

struct Deployed {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Deployed {
    async fn undeploy(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// The consumer, deployed with `upcasters`.
fn deploy(
    system: &System,
    broker: &Broker,
    db: &Db,
    group: &str,
    upcasters: Upcasters,
) -> Deployed {
    let router = Idempotent::new(db.clone(), CONSUMER)
        .upcasters(upcasters)
        .on(RecordOrder)
        .router();
    let worker = consumer_worker(
        system,
        broker,
        router,
        (group, TOPIC, format!("{group}-1")),
        db,
    );
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move { worker.run(token).await.unwrap() });
    Deployed { stop, task }
}

async fn dead_letters(broker: &Broker) -> Vec<Record> {
    let topic = dead_letter_topic();
    let mut letters = Vec::new();
    for (partition, end) in broker.end_offsets(&topic).await.unwrap() {
        let mut from = 0;
        while from < end {
            let read = broker.read(&topic, partition, from, 500).await.unwrap();
            let Some(last) = read.last() else { break };
            from = last.offset + 1;
            letters.extend(read);
        }
    }
    letters
}

async fn applied(db: &SqlitePool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT pedido_id, veces FROM ventas_v2 ORDER BY pedido_id")
        .fetch_all(db)
        .await
        .unwrap()
}

async fn keys(db: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM mensajes_procesados WHERE consumidor = $1")
        .bind(CONSUMER)
        .fetch_one(db)
        .await
        .unwrap()
}

async fn km0(dir: &std::path::Path, broker_url: &str, args: &[&str]) -> Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_km0"))
        .env("KM0_MIGRATE", "true")
        .env("KM0_REPLAY_KEY", REPLAY_KEY)
        .env_remove("KM0_DATABASE")
        .env_remove("KM0_BROKER")
        .env("RUST_LOG", "warn")
        .arg("--database")
        .arg(format!("sqlite://{}", dir.display()))
        .args(["--broker", broker_url])
        .args(args)
        .output()
        .await
        .expect("run km0");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "km0 {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("km0 {args:?}: {e}: {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_the_consumer_cannot_read_is_replayed_once_its_upcaster_is_deployed() {
    let kafka = KafkaNamespace::new();
    let mut dbs = Databases::new();
    let seed_url = dbs
        .create(&format!("entrega_t_{}_seed", uuid::Uuid::new_v4().simple()))
        .await;
    let dir = std::env::temp_dir().join(format!("km0-schema-{}", uuid::Uuid::new_v4().simple()));
    let system = System::new(
        Km0Databases::new(DataPlace::SqliteDir(dir.clone())),
        kafka.url(),
    )
    .with_replay_key(entrega_core::ReplayKey::new(REPLAY_KEY).unwrap());
    let broker = system.broker().await.unwrap();
    ensure_topics(&broker).await.unwrap();
    let group = format!("ejercicio-{}", uuid::Uuid::new_v4().simple());

    // The seed's pedidos and relay: version 1, as the seed writes it.
    let relay = argv(&format!(
        "--bootstrap {} --dsn {seed_url} --topic {} --orders {ORDERS}",
        kafka.bootstrap(),
        kafka.wire(TOPIC)
    ));
    let summary = run_ok("seed_relay.py", &relay).await;
    assert_eq!(summary["published"], ORDERS, "{summary}");
    let seed = PgPool::connect(&seed_url).await.unwrap();
    let versions: Vec<i32> = sqlx::query_scalar("SELECT DISTINCT version FROM outbox")
        .fetch_all(&seed)
        .await
        .unwrap();
    assert_eq!(versions, [1], "the seed publishes version 1");

    let db_path = dir.join("ejercicio.db");
    let db = Db::connect(&format!("sqlite://{}", db_path.display()))
        .await
        .unwrap();
    db.migrate(&[MigrationSet::Inbox, MigrationSet::HeldLetters])
        .await
        .unwrap();
    db.apply_migrations("ejercicio", TABLES).await.unwrap();
    let rows = SqlitePool::connect(&format!("sqlite://{}", db_path.display()))
        .await
        .unwrap();

    // 1. Written for version 2 only: every version 1 is a dead letter of class esquema,
    //    at the first attempt, naming both versions; nothing applied, no key kept.
    let v2_only = deploy(&system, &broker, &db, &group, Upcasters::new());
    eventually(PATIENCE, "a dead letter per order", || async {
        (dead_letters(&broker).await.len() == usize::try_from(ORDERS).unwrap()).then_some(())
    })
    .await;
    v2_only.undeploy().await;
    for letter in dead_letters(&broker).await {
        let motivo = letter.headers.get(MOTIVO).unwrap_or_default();
        assert!(
            motivo.starts_with(
                "esquema: `pedido.creado` version 1 cannot be read: no upcaster from version 1 to 2"
            ),
            "{motivo}"
        );
        assert_eq!(letter.headers.get("intentos"), Some("1"), "never retried");
    }
    assert!(applied(&rows).await.is_empty());
    assert_eq!(keys(&rows).await, 0);
    let listed = km0(
        &dir,
        &kafka.url(),
        &["dlq", "list", "--motivo", "esquema", "--json"],
    )
    .await;
    assert_eq!(
        listed.as_array().unwrap().len(),
        usize::try_from(ORDERS).unwrap()
    );

    // 2. The upcaster deployed, the letters replayed to this consumer's group: each order
    //    applied once.
    let fixed = deploy(
        &system,
        &broker,
        &db,
        &group,
        km0::contracts::upcasters().clone(),
    );
    let replayed = km0(
        &dir,
        &kafka.url(),
        &[
            "dlq", "replay", "--motivo", "esquema", "--group", &group, "--json",
        ],
    )
    .await;
    assert_eq!(
        replayed["applied"].as_array().unwrap().len(),
        usize::try_from(ORDERS).unwrap(),
        "{replayed:#}"
    );
    eventually(PATIENCE, "every order applied", || async {
        (applied(&rows).await.len() == usize::try_from(ORDERS).unwrap()).then_some(())
    })
    .await;
    // Asked for again: nothing is pending, nothing is applied twice.
    let again = km0(
        &dir,
        &kafka.url(),
        &[
            "dlq", "replay", "--motivo", "esquema", "--group", &group, "--json",
        ],
    )
    .await;
    assert_eq!(again["matched"], 0, "{again:#}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    fixed.undeploy().await;

    let expected: Vec<(String, i64)> = (1..=ORDERS)
        .map(|i| (format!("P-2026-{i:06}"), 1))
        .collect();
    assert_eq!(applied(&rows).await, expected, "each order applied once");
    assert_eq!(keys(&rows).await, ORDERS);
    assert_eq!(
        dead_letters(&broker).await.len(),
        usize::try_from(ORDERS).unwrap(),
        "no new dead letters once the upcaster is deployed"
    );

    rows.close().await;
    db.close().await;
    seed.close().await;
    broker.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
