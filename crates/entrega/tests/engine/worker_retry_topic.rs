//! The seed's non-blocking retries: a transient failure goes to `<topic>.retry` with
//! `intentos`, `no_antes` and `ultimo_error`, the source partition goes on, the retry consumer
//! holds each record until its `no_antes`, and the last attempt goes to `<topic>.dlq`.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use entrega::{Backoff, RetryStrategy, Router, WorkerConfig};
use entrega_core::headers::{
    INTENTOS, MOTIVO, NO_ANTES, ORIGIN_GROUP, ORIGIN_OFFSET, ORIGIN_TOPIC, ULTIMO_ERROR,
};
use entrega_core::{Headers, OutgoingMessage};
use entrega_testkit::{wait_until, LogFixture};
use support::handlers::{Scripted, Step};
use support::worker_steps::{
    caught_up, config, dead_letters, header, publish, setup, Running, GROUP, PATIENCE, TOPIC,
};
use support::{all_records, event_message, Env};

const RETRY: &str = "pedidos.eventos.retry";

fn retry_config(base_ms: u64) -> WorkerConfig {
    let mut config = config().with_retry(RetryStrategy::RetryTopic);
    config.backoff = Backoff::new(
        Duration::from_millis(base_ms),
        Duration::from_millis(base_ms * 4),
    )
    .with_jitter(0.0);
    config
}

/// Source and retry topic both committed to their ends.
async fn all_caught_up(log: &dyn LogFixture) -> bool {
    if !caught_up(log).await {
        return false;
    }
    let ends: Vec<(u32, i64)> = log
        .end_offsets(RETRY)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, e)| *e > 0)
        .collect();
    log.committed(GROUP, RETRY).await.unwrap_or_default() == ends
}

async fn wait_all_caught_up(env: &Env) {
    let log = env.log.as_ref();
    assert!(
        wait_until(PATIENCE, || all_caught_up(log)).await,
        "{:?}: source or retry topic not committed to the end",
        env.backend
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_message_waits_in_the_retry_topic_while_its_partition_goes_on() {
    for env in setup(1).await {
        publish(&env, "P-1", "pedido.creado", 0..1).await;
        publish(&env, "P-2", "pedido.creado", 0..5).await;
        // P-1 fails twice, then succeeds; everything else succeeds at once.
        let handler = Arc::new(Scripted::new(|m| {
            if m.key.as_deref() == Some("P-1") && m.attempt <= 2 {
                Step::Transient
            } else {
                Step::Ok
            }
        }));
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
            retry_config(300),
        );
        let h = handler.clone();
        assert!(
            wait_until(PATIENCE, || {
                let h = h.clone();
                async move { h.applied_ns("P-1") == vec![0] }
            })
            .await,
            "{:?}: P-1 never applied",
            env.backend
        );
        wait_all_caught_up(&env).await;
        let stats = running.stats.clone();
        running.stop().await;

        // The partition did not wait: P-2 was applied before P-1's first retry was due.
        let order: Vec<String> = handler
            .applied()
            .iter()
            .map(|m| m.key.clone().unwrap())
            .collect();
        assert_eq!(
            order,
            vec!["P-2", "P-2", "P-2", "P-2", "P-2", "P-1"],
            "{:?}",
            env.backend
        );
        let id = handler.applied()[5].id();
        assert_eq!(handler.attempts_of(&id), vec![1, 2, 3], "{:?}", env.backend);

        // The retry topic holds the seed's headers: attempts made, when, why, from where.
        let retries = all_records(env.log.as_ref(), RETRY).await;
        assert_eq!(retries.len(), 2, "{:?}", env.backend);
        let intentos: Vec<&str> = retries.iter().map(|r| header(r, INTENTOS)).collect();
        assert_eq!(intentos, vec!["1", "2"]);
        for r in &retries {
            assert_eq!(r.key.as_deref(), Some("P-1"));
            assert!(header(r, NO_ANTES).parse::<f64>().unwrap() > 1.0e9);
            assert_eq!(header(r, ULTIMO_ERROR), "inventario db restarting");
            assert_eq!(header(r, ORIGIN_TOPIC), TOPIC);
            assert_eq!(header(r, ORIGIN_OFFSET), "0");
            assert_eq!(header(r, ORIGIN_GROUP), GROUP);
        }
        let due = |k: usize| header(&retries[k], NO_ANTES).parse::<f64>().unwrap();
        let written = |k: usize| retries[k].timestamp_ms as f64 / 1000.0;
        // 300 ms, then 600 ms of backoff, as the policy says.
        assert!((due(0) - written(0) - 0.3).abs() < 0.1, "first delay");
        assert!((due(1) - written(1) - 0.6).abs() < 0.1, "second delay");
        assert!(dead_letters(&env).await.is_empty());
        assert_eq!((stats.deferred(), stats.retried()), (2, 2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_attempt_dead_letters_with_the_source_as_origin() {
    for env in setup(1).await {
        publish(&env, "P-0", "pedido.creado", 0..1).await;
        publish(&env, "P-1", "pedido.creado", 0..1).await;
        let handler = Arc::new(Scripted::new(|m| {
            if m.key.as_deref() == Some("P-1") {
                Step::Transient
            } else {
                Step::Ok
            }
        }));
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
            retry_config(20),
        );
        let e = &env;
        assert!(
            wait_until(PATIENCE, || async move { dead_letters(e).await.len() == 1 }).await,
            "{:?}: no dead letter",
            env.backend
        );
        wait_all_caught_up(&env).await;
        let stats = running.stats.clone();
        running.stop().await;
        let dead = dead_letters(&env).await;
        assert_eq!(header(&dead[0], INTENTOS), "3", "{:?}", env.backend);
        assert!(header(&dead[0], MOTIVO).starts_with("transient exhausted after 3 attempts"));
        assert_eq!(
            header(&dead[0], ORIGIN_TOPIC),
            TOPIC,
            "origin is the source"
        );
        assert_eq!(header(&dead[0], ORIGIN_OFFSET), "1");
        assert_eq!(dead[0].key.as_deref(), Some("P-1"));
        assert_eq!(all_records(env.log.as_ref(), RETRY).await.len(), 2);
        assert_eq!(stats.deferred(), 2);
        assert_eq!(stats.dead_lettered(), 1);
        assert_eq!(handler.applied_ns("P-0"), vec![0]);
    }
}

/// Writes one record straight into the retry topic.
async fn put_retry(env: &Env, key: &str, n: u32, headers: Headers) -> String {
    env.log.admin().ensure_topic(RETRY, 1).await.unwrap();
    let (envelope, message) = event_message(TOPIC, key, "pedido.creado", n);
    let mut all = message.headers.clone();
    for (name, value) in headers.iter() {
        all.set(name, value);
    }
    let message = OutgoingMessage {
        topic: RETRY.into(),
        headers: all,
        ..message
    };
    env.log.publisher().publish(&[message]).await.unwrap();
    envelope.id.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_records_of_other_groups_and_bad_headers_are_not_run() {
    for env in setup(1).await {
        let now = entrega_core::now_ms() as f64 / 1000.0;
        let other = put_retry(
            &env,
            "P-1",
            0,
            Headers::new()
                .with(ORIGIN_GROUP, "analitica")
                .with(INTENTOS, "1"),
        )
        .await;
        put_retry(
            &env,
            "P-2",
            0,
            Headers::new()
                .with(ORIGIN_GROUP, GROUP)
                .with(INTENTOS, "uno"),
        )
        .await;
        // A seed-style record without an origin group belongs to every group.
        let seed = put_retry(
            &env,
            "P-3",
            0,
            Headers::new()
                .with(INTENTOS, "1")
                .with(NO_ANTES, format!("{now:.3}")),
        )
        .await;
        let handler = Arc::new(Scripted::ok());
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
            retry_config(20),
        );
        wait_all_caught_up(&env).await;
        let stats = running.stats.clone();
        running.stop().await;
        assert!(handler.attempts_of(&other).is_empty(), "{:?}", env.backend);
        assert_eq!(
            handler.attempts_of(&seed),
            vec![2],
            "intentos 1 → attempt 2"
        );
        let dead = dead_letters(&env).await;
        assert_eq!(dead.len(), 1, "{:?}", env.backend);
        assert_eq!(dead[0].key.as_deref(), Some("P-2"));
        assert!(header(&dead[0], MOTIVO).contains("intentos"));
        assert_eq!(stats.ignored(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_record_is_not_run_before_its_no_antes() {
    for env in setup(1).await {
        let due_ms = entrega_core::now_ms() + 800;
        let id = put_retry(
            &env,
            "P-1",
            0,
            Headers::new()
                .with(INTENTOS, "1")
                .with(NO_ANTES, format!("{:.3}", due_ms as f64 / 1000.0)),
        )
        .await;
        let handler = Arc::new(Scripted::ok());
        let running = Running::start_with(
            env.log.as_ref(),
            env.log.publisher(),
            Router::new().route("pedido.creado", handler.clone()),
            retry_config(20),
        );
        // Meanwhile the source topic flows.
        publish(&env, "P-2", "pedido.creado", 0..3).await;
        let h = handler.clone();
        assert!(
            wait_until(PATIENCE, || {
                let h = h.clone();
                async move { h.applied().len() == 4 }
            })
            .await
        );
        let ran_at = entrega_core::now_ms();
        running.stop().await;
        let applied = handler.applied();
        assert_eq!(applied.last().map(|m| m.id()), Some(id.clone()));
        assert!(ran_at >= due_ms, "{:?}: ran before no_antes", env.backend);
        assert_eq!(
            handler.attempts_of(&id),
            vec![2],
            "held without counting attempts"
        );
    }
}
