//! Ordered retries: when a message of key K fails, K's later messages are parked in order
//! until its head succeeds or is dead-lettered, while every other key keeps flowing; a member
//! that takes the partition over keeps that order.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entrega::{Backoff, CancellationToken, RetryStrategy, Router, Worker, WorkerConfig};
use entrega_core::headers::{INTENTOS, MOTIVO};
use entrega_core::{MigrationSet, ParkingStore};
use entrega_testkit::memory::MemoryParking;
use entrega_testkit::wait_until;
use support::handlers::{Scripted, Step};
use support::worker_steps::{
    config, dead_letters, header, publish, setup, wait_caught_up, Running, GROUP, PATIENCE, TOPIC,
};
use support::{sqlite_pool, Backend, Env, TempDir};

fn ordered_config(base_ms: u64) -> WorkerConfig {
    let mut config = config().with_retry(RetryStrategy::Ordered);
    config.backoff = Backoff::new(
        Duration::from_millis(base_ms),
        Duration::from_millis(base_ms * 4),
    )
    .with_jitter(0.0);
    config
}

/// A parking store on the environment's backend (the consumer's database).
async fn parking(env: &Env, dir: &TempDir) -> Arc<dyn ParkingStore> {
    match env.backend {
        Backend::Memory => Arc::new(MemoryParking::new()),
        // Worker tests run the log on SQLite for both database backends.
        Backend::Sqlite | Backend::Postgres => {
            let pool = sqlite_pool(dir, "inventario.db", MigrationSet::Inbox).await;
            entrega::Db::from(pool).parking()
        }
    }
}

fn start(
    env: &Env,
    store: &Arc<dyn ParkingStore>,
    handler: &Arc<Scripted>,
    config: WorkerConfig,
) -> Running {
    let router = Router::new()
        .route("pedido.creado", handler.clone())
        .route("pedido.cancelado", handler.clone());
    let worker = Worker::new(env.log.subscriber(), env.log.publisher(), router, config)
        .with_admin(env.log.admin())
        .with_parking(store.clone());
    let stats = worker.stats();
    let token = CancellationToken::new();
    let run_token = token.clone();
    let handle = tokio::spawn(async move { worker.run(run_token).await });
    Running {
        token,
        handle,
        stats,
    }
}

/// `(key, tipo)` of every applied message, in the order applied.
fn applied(handler: &Scripted) -> Vec<(String, String)> {
    handler
        .applied()
        .iter()
        .map(|m| (m.key.clone().unwrap(), m.kind().to_owned()))
        .collect()
}

async fn wait_applied(handler: &Arc<Scripted>, n: usize) -> bool {
    wait_until(PATIENCE, || {
        let h = handler.clone();
        async move { h.applied().len() >= n }
    })
    .await
}

async fn parked_count(store: &Arc<dyn ParkingStore>) -> usize {
    store.list(GROUP, TOPIC, 1000).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creado_then_cancelado_apply_in_order_when_creado_fails_twice() {
    for env in setup(1).await {
        let dir = TempDir::new();
        let store = parking(&env, &dir).await;
        publish(&env, "P-1", "pedido.creado", 0..1).await;
        publish(&env, "P-2", "pedido.creado", 0..2).await;
        publish(&env, "P-1", "pedido.cancelado", 1..2).await;
        publish(&env, "P-2", "pedido.cancelado", 2..3).await;
        let handler = Arc::new(Scripted::new(|m| {
            if m.kind() == "pedido.creado" && m.key.as_deref() == Some("P-1") && m.attempt <= 2 {
                Step::Transient
            } else {
                Step::Ok
            }
        }));
        let running = start(&env, &store, &handler, ordered_config(150));
        assert!(wait_applied(&handler, 5).await, "{:?}", env.backend);
        wait_caught_up(&env).await;
        let s = &store;
        assert!(wait_until(PATIENCE, || async move { parked_count(s).await == 0 }).await);
        let stats = running.stats.clone();
        running.stop().await;

        let order = applied(&handler);
        let p1: Vec<&str> = order
            .iter()
            .filter(|(k, _)| k == "P-1")
            .map(|(_, t)| t.as_str())
            .collect();
        assert_eq!(
            p1,
            vec!["pedido.creado", "pedido.cancelado"],
            "{:?}",
            env.backend
        );
        // P-2 did not wait for P-1: all of it went before P-1's first retry was due.
        let first_p1 = order.iter().position(|(k, _)| k == "P-1").unwrap();
        assert_eq!(first_p1, 3, "{:?}: {order:?}", env.backend);
        let creado = handler
            .applied()
            .into_iter()
            .find(|m| m.key.as_deref() == Some("P-1") && m.kind() == "pedido.creado")
            .unwrap();
        assert_eq!(handler.attempts_of(&creado.id()), vec![1, 2, 3]);
        // The head and the record behind it were parked; the head was retried twice.
        assert_eq!(
            (stats.parked(), stats.retried()),
            (2, 2),
            "{:?}",
            env.backend
        );
        assert!(dead_letters(&env).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_head_releases_the_key() {
    for env in setup(1).await {
        let dir = TempDir::new();
        let store = parking(&env, &dir).await;
        publish(&env, "P-1", "pedido.creado", 0..1).await;
        publish(&env, "P-1", "pedido.cancelado", 1..2).await;
        publish(&env, "P-2", "pedido.creado", 0..1).await;
        let handler = Arc::new(Scripted::new(|m| {
            if m.kind() == "pedido.creado" && m.key.as_deref() == Some("P-1") {
                Step::Transient
            } else {
                Step::Ok
            }
        }));
        let running = start(&env, &store, &handler, ordered_config(20));
        assert!(wait_applied(&handler, 2).await, "{:?}", env.backend);
        wait_caught_up(&env).await;
        running.stop().await;
        let dead = dead_letters(&env).await;
        assert_eq!(dead.len(), 1, "{:?}", env.backend);
        assert_eq!(header(&dead[0], INTENTOS), "3");
        assert!(header(&dead[0], MOTIVO).starts_with("transient exhausted"));
        // cancelado ran only after creado's last attempt.
        let order = applied(&handler);
        assert_eq!(
            order,
            vec![
                ("P-2".to_owned(), "pedido.creado".to_owned()),
                ("P-1".to_owned(), "pedido.cancelado".to_owned())
            ]
        );
        assert_eq!(parked_count(&store).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_taking_over_keeps_the_parked_order() {
    for env in setup(1).await {
        let dir = TempDir::new();
        let store = parking(&env, &dir).await;
        publish(&env, "P-1", "pedido.creado", 0..1).await;
        // creado fails until the cause is fixed, after the first member is gone.
        let fixed = Arc::new(AtomicBool::new(false));
        let script = |fixed: Arc<AtomicBool>| {
            move |m: &entrega::Message| {
                let p1_creado = m.kind() == "pedido.creado" && m.key.as_deref() == Some("P-1");
                if p1_creado && !fixed.load(Ordering::SeqCst) {
                    Step::Transient
                } else {
                    Step::Ok
                }
            }
        };
        let mut cfg = ordered_config(100);
        cfg.max_attempts = 50;
        let first = Arc::new(Scripted::new(script(fixed.clone())));
        let running = start(&env, &store, &first, cfg.clone());
        let s = &store;
        assert!(
            wait_until(PATIENCE, || async move { parked_count(s).await == 1 }).await,
            "{:?}: creado not parked",
            env.backend
        );
        wait_caught_up(&env).await;
        running.stop().await;

        // While nobody consumes, cancelado arrives; the next member must park it behind creado.
        publish(&env, "P-1", "pedido.cancelado", 1..2).await;
        publish(&env, "P-2", "pedido.creado", 0..1).await;
        let second = Arc::new(Scripted::new(script(fixed.clone())));
        let running = start(&env, &store, &second, cfg);
        let h = second.clone();
        assert!(
            wait_until(PATIENCE, || {
                let h = h.clone();
                async move { h.applied_ns("P-2") == vec![0] }
            })
            .await
        );
        assert!(
            wait_until(PATIENCE, || async move { parked_count(s).await == 2 }).await,
            "{:?}: cancelado not parked behind creado",
            env.backend
        );
        assert!(second.applied_ns("P-1").is_empty(), "P-1 ran while parked");
        fixed.store(true, Ordering::SeqCst);
        assert!(wait_applied(&second, 3).await, "{:?}", env.backend);
        running.stop().await;
        let p1: Vec<String> = applied(&second)
            .into_iter()
            .filter(|(k, _)| k == "P-1")
            .map(|(_, t)| t)
            .collect();
        assert_eq!(
            p1,
            vec!["pedido.creado", "pedido.cancelado"],
            "{:?}",
            env.backend
        );
        assert_eq!(parked_count(&store).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_retries_need_a_parking_store() {
    let env = setup(1).await.remove(0);
    let worker = Worker::new(
        env.log.subscriber(),
        env.log.publisher(),
        Router::new(),
        ordered_config(10),
    );
    let err = worker.run(CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, entrega::WorkerError::NoParkingStore), "{err}");
}
