//! Dead letters the broker refuses (their topic missing, the letter too large, the broker
//! refusing for too long) are held in the consumer's database: the partition goes on,
//! nothing is lost, and an operator sends them on once the cause is mended.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::sync::Arc;

use async_trait::async_trait;
use entrega::db::Backend;
use entrega::dlq::send_held;
use entrega::{CancellationToken, Router, Worker};
use entrega_core::headers::MOTIVO;
use entrega_core::{HeldLetterStore, MigrationSet, OutgoingMessage, Publisher, TransportError};
use entrega_testkit::{wait_until, Fault, FlakyPublisher};
use support::handlers::{Scripted, Step};
use support::pg::FreshDb;
use support::worker_steps::{
    caught_up, config, dead_letters, publish, setup, Running, DLQ, GROUP, PATIENCE, TOPIC,
};
use support::TempDir;

const STORES: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];

async fn held_store(backend: Backend, dir: &TempDir) -> (FreshDb, Arc<dyn HeldLetterStore>) {
    let fresh = FreshDb::new(backend, dir, "inventario.db").await;
    fresh
        .db
        .migrate(&[MigrationSet::Inbox, MigrationSet::HeldLetters])
        .await
        .expect("migrate");
    let store = fresh.db.held_letters();
    (fresh, store)
}

/// A worker that may not create topics, holding refused letters in `held`.
fn start(
    env: &support::Env,
    publisher: Arc<dyn Publisher>,
    router: Router,
    held: Arc<dyn HeldLetterStore>,
) -> Running {
    let worker =
        Worker::new(env.log.subscriber(), publisher, router, config()).with_held_letters(held);
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

fn fails_on(n: u64) -> Arc<Scripted> {
    Arc::new(Scripted::new(move |m| {
        if m.envelope.data["n"] == n {
            Step::Permanent
        } else {
            Step::Ok
        }
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_whose_topic_is_missing_is_held_and_the_partition_goes_on() {
    for backend in STORES {
        for env in setup(1).await {
            let dir = TempDir::new();
            let (fresh, held) = held_store(backend, &dir).await;
            let ids = publish(&env, "P-1", "pedido.creado", 0..3).await;
            let handler = fails_on(1);
            let running = start(
                &env,
                env.log.publisher(),
                Router::new().route("pedido.creado", handler.clone()),
                held.clone(),
            );
            let log = env.log.as_ref();
            assert!(wait_until(PATIENCE, || caught_up(log)).await, "{backend:?}");
            let stats = running.stats.clone();
            running.stop().await;

            assert_eq!(handler.applied_ns("P-1"), vec![0, 2], "{backend:?}");
            assert_eq!(stats.held(), 1);
            assert!(env.log.end_offsets(DLQ).await.is_err() || dead_letters(&env).await.is_empty());
            let letters = held.list(10).await.unwrap();
            assert_eq!(letters.len(), 1, "{backend:?} {:?}", env.backend);
            let letter = &letters[0];
            assert_eq!(
                (letter.id.group.as_str(), letter.id.topic.as_str()),
                (GROUP, TOPIC)
            );
            assert_eq!((letter.id.partition, letter.id.offset), (0, 1));
            assert_eq!(letter.letter.topic, DLQ);
            assert_eq!(letter.letter.key.as_deref(), Some("P-1"));
            assert_eq!(
                letter.letter.headers.get("id_evento"),
                Some(ids[1].as_str())
            );
            assert!(letter.letter.headers.get(MOTIVO).is_some());
            assert!(letter.refusal.contains(DLQ), "{}", letter.refusal);

            // The operator creates the topic and sends the letter on: it is in the
            // dead-letter topic once, and held no more.
            env.log.admin().ensure_topic(DLQ, 1).await.unwrap();
            let report = send_held(held.as_ref(), env.log.publisher().as_ref(), 10)
                .await
                .unwrap();
            assert_eq!(report.sent.len(), 1);
            assert!(report.refused.is_empty());
            let dlq = dead_letters(&env).await;
            assert_eq!(dlq.len(), 1);
            assert_eq!(dlq[0].payload, letter.letter.payload);
            assert_eq!(dlq[0].headers.get("id_evento"), Some(ids[1].as_str()));
            assert_eq!(held.count().await.unwrap(), 0);
            fresh.finish().await;
        }
    }
}

/// Refuses messages to the dead-letter topic larger than `max` bytes, as a broker's
/// `max.message.bytes` does.
struct SizeLimited {
    inner: Arc<dyn Publisher>,
    max: usize,
}

#[async_trait]
impl Publisher for SizeLimited {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if let Some(m) = batch
            .iter()
            .find(|m| m.topic == DLQ && m.payload.len() > self.max)
        {
            return Err(TransportError::Rejected {
                reason: format!(
                    "message of {} bytes is larger than {}",
                    m.payload.len(),
                    self.max
                ),
            });
        }
        self.inner.publish(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_letter_refused_is_held_and_the_others_of_its_batch_are_published() {
    let env = setup(1).await.pop().expect("sqlite log");
    env.log.admin().ensure_topic(DLQ, 1).await.unwrap();
    let dir = TempDir::new();
    let (fresh, held) = held_store(Backend::Sqlite, &dir).await;
    // Three letters in one poll; the middle one is larger than the broker takes.
    let mut ids = publish(&env, "P-1", "pedido.creado", 0..1).await;
    let (envelope, mut big) = support::event_message(TOPIC, "P-2", "pedido.creado", 1);
    big.payload.extend(std::iter::repeat_n(b' ', 4096));
    env.log.publisher().publish(&[big]).await.unwrap();
    ids.push(envelope.id.to_string());
    ids.extend(publish(&env, "P-3", "pedido.creado", 2..3).await);
    let handler = Arc::new(Scripted::new(|_| Step::Permanent));
    let publisher = Arc::new(SizeLimited {
        inner: env.log.publisher(),
        max: 1024,
    });
    let running = start(
        &env,
        publisher,
        Router::new().route("pedido.creado", handler.clone()),
        held.clone(),
    );
    let log = env.log.as_ref();
    assert!(wait_until(PATIENCE, || caught_up(log)).await);
    let stats = running.stats.clone();
    running.stop().await;

    let published: Vec<String> = dead_letters(&env)
        .await
        .iter()
        .map(|r| r.headers.get("id_evento").unwrap().to_owned())
        .collect();
    assert_eq!(published, vec![ids[0].clone(), ids[2].clone()]);
    let letters = held.list(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        letters[0].letter.headers.get("id_evento"),
        Some(ids[1].as_str())
    );
    assert!(
        letters[0].refusal.contains("larger than"),
        "{}",
        letters[0].refusal
    );
    assert_eq!((stats.dead_lettered(), stats.held()), (3, 1));
    fresh.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_refusing_for_too_long_gets_the_letter_held_after_a_bounded_number_of_tries() {
    let env = setup(1).await.pop().expect("sqlite log");
    env.log.admin().ensure_topic(DLQ, 1).await.unwrap();
    let dir = TempDir::new();
    let (fresh, held) = held_store(Backend::Sqlite, &dir).await;
    publish(&env, "P-1", "pedido.creado", 0..2).await;
    let flaky = Arc::new(FlakyPublisher::new(env.log.publisher()));
    flaky.set(Fault::Unavailable);
    let handler = fails_on(0);
    let running = start(
        &env,
        flaky.clone(),
        Router::new().route("pedido.creado", handler.clone()),
        held.clone(),
    );
    let log = env.log.as_ref();
    assert!(wait_until(PATIENCE, || caught_up(log)).await);
    let stats = running.stats.clone();
    running.stop().await;

    // Every delivery tried the batch, then the letter alone: the record was delivered
    // `max_attempts + 5` times (3 + 5) before it was held.
    assert_eq!(flaky.failures(), 2 * 8, "publishes refused");
    assert_eq!(held.count().await.unwrap(), 1);
    assert!(dead_letters(&env).await.is_empty());
    assert_eq!(handler.applied_ns("P-1"), vec![1]);
    assert_eq!(stats.held(), 1);
    fresh.finish().await;
}
