//! `KafkaTransformer` on a real broker (`ENTREGA_TEST_KAFKA`): read-process-write inside
//! Kafka transactions. Each test has topics and groups of its own.
//!
//! - transactions aborted after their records reached the broker leave nothing a
//!   `read_committed` reader sees, and the batch is read again: each input counted once;
//! - a second instance with the same `transactional.id` fences the first, whose later writes
//!   are refused and never seen.
//!
//! The failpoint table is process-wide, so the tests that use it take a lock.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega_core::{failpoint, HandlerError, Headers, OutgoingMessage, Record};
use entrega_kafka::{KafkaTransformer, Transform, TransformError, TransformerConfig};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tokio::sync::{Mutex, Notify};

const INPUTS: usize = 300;
const WITHIN: Duration = Duration::from_secs(60);

static FAILPOINTS: Mutex<()> = Mutex::const_new(());

fn names(test: &str) -> (String, String) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    (format!("tx-in-{test}-{id}"), format!("tx-out-{test}-{id}"))
}

async fn topics(input: &str, output: &str) {
    let kafka = support::connect(support::test_config()).await.unwrap();
    kafka.admin().ensure_topic(input, 3).await.unwrap();
    kafka.admin().ensure_topic(output, 3).await.unwrap();
}

/// `INPUTS` records `n` (as text), keyed by `n % 10`, written without a transaction.
async fn produce_inputs(topic: &str) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", support::bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for n in 0..INPUTS {
        let (key, value) = ((n % 10).to_string(), n.to_string());
        producer
            .send(
                FutureRecord::to(topic).key(&key).payload(&value),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
}

/// Every payload of `topic` as a reader at `isolation` sees it, read to the end.
fn read_all(topic: &str, isolation: &str) -> Vec<String> {
    let group = format!("reader-{}", uuid::Uuid::new_v4().simple());
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", support::bootstrap())
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    let mut quiet_since = Instant::now();
    let started = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(3) && started.elapsed() < WITHIN {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                out.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
                quiet_since = Instant::now();
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    out
}

/// Copies each input record to `output` with the same key.
struct Copy {
    output: String,
}

#[async_trait]
impl Transform for Copy {
    async fn transform(&self, batch: &[Record]) -> Result<Vec<OutgoingMessage>, HandlerError> {
        Ok(batch
            .iter()
            .map(|r| OutgoingMessage {
                topic: self.output.clone(),
                key: r.key.clone(),
                headers: Headers::new(),
                payload: r.payload.clone(),
            })
            .collect())
    }
}

/// Runs `transformer` with a [`Copy`] to `output` on a task of its own until the returned
/// sender is used (or dropped).
fn spawn_copy(
    transformer: KafkaTransformer,
    output: &str,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<entrega_kafka::TransformStats, TransformError>>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let copy = Copy {
        output: output.to_owned(),
    };
    let run = tokio::spawn(async move {
        transformer
            .run(&copy, async {
                let _ = stop_rx.await;
            })
            .await
    });
    (stop_tx, run)
}

fn config(input: &str, group: &str, transactional_id: &str) -> TransformerConfig {
    TransformerConfig::new(group, format!("{group}-member"), transactional_id, &[input])
        .with_max_batch(50)
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each value 0..INPUTS exactly once.
fn assert_each_once(seen: &[String]) {
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for v in seen {
        *counts.entry(v.parse().expect("a number")).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, c)| **c > 1).collect();
    assert!(twice.is_empty(), "counted more than once: {twice:?}");
    assert_eq!(counts.len(), INPUTS, "inputs missing from the output");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_transactions_leave_nothing_and_each_input_counts_once() {
    let _guard = FAILPOINTS.lock().await;
    let (input, output) = names("abort");
    topics(&input, &output).await;
    produce_inputs(&input).await;

    // Every commit fails after the batch's records were acknowledged, until lifted.
    failpoint::configure(&format!(
        "{}=error",
        failpoint::KAFKA_TRANSFORM_BEFORE_COMMIT
    ))
    .unwrap();
    let transformer = KafkaTransformer::start(
        &support::test_config(),
        config(&input, &format!("g-{input}"), &format!("t-{input}")),
    )
    .await
    .unwrap();
    let stats = transformer.stats();
    let (stop_tx, run) = spawn_copy(transformer, &output);
    wait_for("three aborted transactions", || stats.aborted() >= 3).await;
    assert_eq!(
        stats.committed(),
        0,
        "a transaction committed past the failpoint"
    );
    failpoint::configure("").unwrap();
    wait_for("every input committed", || {
        stats.records_in() >= INPUTS as u64
    })
    .await;
    let _ = stop_tx.send(());
    run.await.unwrap().unwrap();

    assert_each_once(&read_all(&output, "read_committed"));
    let uncommitted = read_all(&output, "read_uncommitted");
    assert!(
        uncommitted.len() > INPUTS,
        "the aborted batches' records should be in the log, hidden from read_committed \
         readers ({} records)",
        uncommitted.len()
    );
    assert_eq!(stats.records_in(), INPUTS as u64, "inputs committed twice");
}

/// Holds its first batch until released, then copies.
struct Held {
    copy: Copy,
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

#[async_trait]
impl Transform for Held {
    async fn transform(&self, batch: &[Record]) -> Result<Vec<OutgoingMessage>, HandlerError> {
        self.entered.notify_one();
        self.release.notified().await;
        self.copy.transform(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_with_the_same_transactional_id_fences_the_first() {
    let (input, output) = names("fence");
    topics(&input, &output).await;
    produce_inputs(&input).await;
    let transactional_id = format!("t-{input}");

    let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let zombie = KafkaTransformer::start(
        &support::test_config(),
        config(&input, &format!("g1-{input}"), &transactional_id),
    )
    .await
    .unwrap();
    let held = Held {
        copy: Copy {
            output: output.clone(),
        },
        entered: entered.clone(),
        release: release.clone(),
    };
    let zombie_run = tokio::spawn(async move { zombie.run(&held, std::future::pending()).await });
    entered.notified().await;

    // The new instance registers the same id: the zombie's producer epoch is now stale.
    let successor = KafkaTransformer::start(
        &support::test_config(),
        config(&input, &format!("g2-{input}"), &transactional_id),
    )
    .await
    .unwrap();
    let stats = successor.stats();
    let (stop_tx, successor_run) = spawn_copy(successor, &output);
    wait_for("the successor to copy every input", || {
        stats.records_in() >= INPUTS as u64
    })
    .await;

    release.notify_one();
    let zombie_result = tokio::time::timeout(WITHIN, zombie_run)
        .await
        .expect("the zombie stops")
        .unwrap();
    assert!(
        matches!(zombie_result, Err(TransformError::Fenced { .. })),
        "the zombie must stop as fenced, got {zombie_result:?}"
    );
    let _ = stop_tx.send(());
    successor_run.await.unwrap().unwrap();
    assert_each_once(&read_all(&output, "read_committed"));
}

/// A copy whose `before_commit` never returns for the batch after the first one: an instance
/// that dies with its transaction open and its records written.
struct StallOnce {
    copy: Copy,
    batches: std::sync::atomic::AtomicUsize,
    /// Records of the one batch this instance commits.
    first_batch: std::sync::atomic::AtomicUsize,
    stalled: Arc<Notify>,
}

#[async_trait]
impl Transform for StallOnce {
    async fn transform(&self, batch: &[Record]) -> Result<Vec<OutgoingMessage>, HandlerError> {
        self.copy.transform(batch).await
    }

    async fn before_commit(&self, batch: &[Record]) -> Result<(), HandlerError> {
        let n = self
            .batches
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n == 0 {
            self.first_batch
                .store(batch.len(), std::sync::atomic::Ordering::SeqCst);
        } else {
            self.stalled.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_stalled_before_its_commit_is_replaced_and_its_open_transaction_hidden() {
    let (input, output) = names("stalled");
    let group = format!("g-{input}");
    let tx_id = format!("t-{input}");
    topics(&input, &output).await;
    produce_inputs(&input).await;

    let first = KafkaTransformer::start(&support::test_config(), config(&input, &group, &tx_id))
        .await
        .unwrap();
    let stalled = Arc::new(Notify::new());
    let stall = StallOnce {
        copy: Copy {
            output: output.clone(),
        },
        batches: std::sync::atomic::AtomicUsize::new(0),
        first_batch: std::sync::atomic::AtomicUsize::new(0),
        stalled: stalled.clone(),
    };
    // Runs until the second batch's messages are written and its commit never comes; then
    // this instance is dropped mid-transaction, as a killed process leaves it.
    tokio::select! {
        ran = first.run(&stall, std::future::pending::<()>()) => panic!("ended: {:?}", ran.err()),
        () = stalled.notified() => {}
    }
    let committed = stall.first_batch.load(std::sync::atomic::Ordering::SeqCst);
    let written = read_all(&output, "read_uncommitted").len();
    assert!(
        written > committed,
        "the open transaction's records reached the broker: {written} written, {committed} committed"
    );
    assert_eq!(read_all(&output, "read_committed").len(), committed);

    let second = KafkaTransformer::start(&support::test_config(), config(&input, &group, &tx_id))
        .await
        .unwrap();
    let stats = second.stats();
    let (stop, run) = spawn_copy(second, &output);
    wait_for("every input committed by the second instance", || {
        stats.records_in() >= (INPUTS - committed) as u64
    })
    .await;
    let _ = stop.send(());
    run.await.unwrap().unwrap();
    assert_each_once(&read_all(&output, "read_committed"));

    // The inspector reads to each partition's end, past the transactions' markers, and
    // shows what a read_committed reader sees.
    let kafka = support::connect(support::test_config()).await.unwrap();
    let inspector = kafka.inspector();
    let mut seen = Vec::new();
    for (partition, end) in inspector.end_offsets(&output).await.unwrap() {
        let records = inspector.read(&output, partition, 0, 10_000).await.unwrap();
        assert!(records.iter().all(|r| r.offset < end));
        seen.extend(
            records
                .into_iter()
                .map(|r| String::from_utf8_lossy(&r.payload).into_owned()),
        );
    }
    assert_each_once(&seen);
}
