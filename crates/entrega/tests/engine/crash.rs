//! Crash tests with real processes: a child process runs the relay or the worker on SQLite
//! files and is killed by a failpoint (`exit` = status 137, no cleanup, like `kill -9`) at the
//! worst moment; the parent checks what survived and that a restart loses and doubles nothing.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega::broker::DbLog;
use entrega::db::{query, Db};
use entrega::{
    Backoff, CancellationToken, Handler, Message, Relay, RelayConfig, Router, Worker, WorkerConfig,
};
use entrega_core::{
    now_ms, Clock, Envelope, HandlerError, ManualClock, MigrationSet, NewEvent, Publisher,
    SystemClock, TopicAdmin,
};
use entrega_testkit::wait_until;
use serde_json::json;
use sqlx::SqlitePool;
use support::{event_message, TempDir};

const ROLE: &str = "ENTREGA_CRASH_ROLE";
const DIR: &str = "ENTREGA_CRASH_DIR";
const TOPIC: &str = "pedidos.eventos";
const GROUP: &str = "inventario";

async fn open(dir: &Path, file: &str, set: MigrationSet) -> SqlitePool {
    let pool = entrega_sqlite::connect(&format!("sqlite://{}/{file}", dir.display()))
        .await
        .unwrap();
    entrega::Db::from(pool.clone())
        .migrate(&[set])
        .await
        .unwrap();
    pool
}

fn relay(outbox: SqlitePool, broker: SqlitePool, clock: Arc<dyn Clock>) -> Relay {
    let ports = Db::from(outbox).outbox_with_clock(clock.clone());
    Relay::new(
        ports,
        Arc::new(DbLog::with_defaults(Db::from(broker))),
        clock,
        RelayConfig::new("pedidos", support::routing()),
    )
}

/// Applies an event as a stock change, deduplicated by its id in the same transaction.
struct ApplyOnce {
    pool: SqlitePool,
    duplicates: AtomicUsize,
}

#[async_trait]
impl Handler for ApplyOnce {
    async fn handle(&self, msg: &Message) -> Result<(), HandlerError> {
        let mut tx = Db::from(self.pool.clone()).begin().await?;
        if tx.claim(GROUP, &msg.id()).await? {
            tx.execute(query("INSERT INTO efectos (id_evento) VALUES ($1)").bind(msg.id()))
                .await?;
        } else {
            self.duplicates.fetch_add(1, Ordering::SeqCst);
        }
        tx.commit().await?;
        Ok(())
    }
}

async fn inventario(dir: &Path) -> Arc<ApplyOnce> {
    let pool = open(dir, "inventario.db", MigrationSet::Inbox).await;
    sqlx::query("CREATE TABLE IF NOT EXISTS efectos (id_evento TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    Arc::new(ApplyOnce {
        pool,
        duplicates: AtomicUsize::new(0),
    })
}

fn worker(broker: SqlitePool, handler: Arc<ApplyOnce>) -> Worker {
    let log = DbLog::with_defaults(Db::from(broker));
    let mut config = WorkerConfig::new(GROUP, TOPIC);
    config.member = "inventario-1".into();
    config.poll_wait = Duration::from_millis(50);
    config.backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(50));
    Worker::new(
        Arc::new(log.clone()),
        Arc::new(log),
        Router::new().route("pedido.creado", handler),
        config,
    )
}

/// The child side: does nothing in a normal test run; in a child process, plays its role
/// until the failpoint kills it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let (Ok(role), Ok(dir)) = (std::env::var(ROLE), std::env::var(DIR)) else {
        return;
    };
    let dir = Path::new(&dir);
    let broker = open(dir, "broker.db", MigrationSet::Log).await;
    match role.as_str() {
        "relay" => {
            let outbox = open(dir, "pedidos.db", MigrationSet::Outbox).await;
            relay(outbox, broker, Arc::new(SystemClock))
                .drain_once()
                .await
                .unwrap();
        }
        "worker" => {
            let handler = inventario(dir).await;
            let worker = worker(broker, handler);
            let _ = tokio::time::timeout(
                Duration::from_secs(20),
                worker.run(CancellationToken::new()),
            )
            .await;
        }
        other => panic!("unknown role {other}"),
    }
    // Reaching this point means the failpoint did not fire.
    std::process::exit(3);
}

async fn run_child(role: &str, dir: &TempDir, failpoints: &str) -> Option<i32> {
    let status = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash::crash_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE, role)
        .env(DIR, &dir.0)
        .env("ENTREGA_FAILPOINTS", failpoints)
        .status()
        .await
        .unwrap();
    status.code()
}

async fn count(pool: &SqlitePool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Killed after the transport confirmed and before marking: the events are in the log but
/// still pending; the next relay publishes them again with the same `id_evento`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_killed_between_publish_and_mark_publishes_again() {
    let dir = TempDir::new();
    let outbox = open(&dir.0, "pedidos.db", MigrationSet::Outbox).await;
    let broker = open(&dir.0, "broker.db", MigrationSet::Log).await;
    DbLog::with_defaults(Db::from(broker.clone()))
        .ensure_topic(TOPIC, 1)
        .await
        .unwrap();
    let events: Vec<NewEvent> = (0..2)
        .map(|n| NewEvent::new("pedido", "P-1", "pedido.creado", json!({ "n": n })))
        .collect();
    let mut tx = Db::from(outbox.clone()).begin().await.unwrap();
    tx.enqueue_all(&events).await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!(
        run_child("relay", &dir, "relay.after_publish=exit").await,
        Some(137)
    );
    assert_eq!(
        count(
            &outbox,
            "SELECT COUNT(*) FROM outbox WHERE publicado_en IS NULL"
        )
        .await,
        2,
        "marked despite the crash"
    );
    let log = DbLog::with_defaults(Db::from(broker));
    assert_eq!(
        log.read(TOPIC, 0, 0, 100).await.unwrap().len(),
        2,
        "the confirmed publish is durable"
    );

    // The dead instance still holds every lane; a new one takes them once the lease expires.
    let later = ManualClock::new(
        now_ms()
            + RelayConfig::new("pedidos", support::routing())
                .lease_ttl
                .as_millis() as i64
            + 1_000,
    );
    let successor = relay(
        outbox.clone(),
        log.db().sqlite().unwrap().clone(),
        Arc::new(later),
    );
    assert_eq!(successor.drain_once().await.unwrap(), 2);
    assert_eq!(
        count(
            &outbox,
            "SELECT COUNT(*) FROM outbox WHERE publicado_en IS NULL"
        )
        .await,
        0
    );
    let records = log.read(TOPIC, 0, 0, 100).await.unwrap();
    let ids: Vec<_> = records
        .iter()
        .map(|r| Envelope::parse(&r.payload).unwrap().id)
        .collect();
    let want: Vec<_> = events.iter().chain(&events).map(|e| e.id).collect();
    assert_eq!(ids, want, "published twice, same ids, in order");
}

/// Killed after the handler's transaction committed and before the offset commit: the
/// messages come again and the idempotency keys absorb them; every effect happens once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_after_the_effect_applies_it_once() {
    let dir = TempDir::new();
    let broker = open(&dir.0, "broker.db", MigrationSet::Log).await;
    let log = DbLog::with_defaults(Db::from(broker.clone()));
    log.ensure_topic(TOPIC, 1).await.unwrap();
    let batch: Vec<_> = (0..3)
        .map(|n| event_message(TOPIC, "P-1", "pedido.creado", n).1)
        .collect();
    log.publish(&batch).await.unwrap();

    assert_eq!(
        run_child("worker", &dir, "worker.after_handler=exit").await,
        Some(137)
    );
    let handler = inventario(&dir.0).await;
    assert_eq!(
        count(&handler.pool, "SELECT COUNT(*) FROM efectos").await,
        3,
        "effects committed before the crash"
    );
    assert!(
        log.committed(GROUP, TOPIC)
            .await
            .unwrap()
            .iter()
            .all(|(_, o)| *o == 0),
        "offset committed despite the crash"
    );

    let worker = worker(broker, handler.clone());
    let token = CancellationToken::new();
    let run = tokio::spawn({
        let token = token.clone();
        async move { worker.run(token).await }
    });
    let caught_up = wait_until(Duration::from_secs(20), || async {
        log.committed(GROUP, TOPIC).await.unwrap() == vec![(0, 3)]
    })
    .await;
    token.cancel();
    run.await.unwrap().unwrap();
    assert!(caught_up, "the restarted worker did not commit");
    assert_eq!(
        handler.duplicates.load(Ordering::SeqCst),
        3,
        "every redelivery was recognised"
    );
    assert_eq!(
        count(&handler.pool, "SELECT COUNT(*) FROM efectos").await,
        3,
        "an effect was applied twice"
    );
    let keys = Db::from(handler.pool.clone())
        .processed(GROUP)
        .await
        .unwrap();
    assert_eq!(keys, 3);
}
