//! Read-process-write inside Kafka transactions: what one batch of input records produced and
//! the consumer group's new offsets for that batch commit together, or neither does.
//!
//! This is Kafka's exactly-once for pipelines that start and end in Kafka (the seed's
//! "Kafka → Kafka" case). A `read_committed` consumer of the output sees each input counted
//! once however often the transformer crashes, because an aborted or unfinished transaction's
//! records are never shown to it and the input offsets move only with a committed
//! transaction. It does not extend to effects outside Kafka: a database write cannot join
//! the transaction, which is why entrega's consumers that write to a database rely on the
//! idempotent inbox instead.
//!
//! Zombies are fenced twice: by `transactional.id` (a new instance with the same id bumps the
//! producer epoch, and the old one's writes are refused) and by the consumer group's
//! generation, sent with the offsets (a member that lost its partitions in a rebalance cannot
//! commit offsets for them).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{failpoint, HandlerError, OutgoingMessage, Record, TransportError};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::error::transport;
use crate::meta::blocking;
use crate::publisher::future_record;
use crate::record::to_record;
use crate::transform_error::{is_fenced, step_error, Step, TransformError};
use crate::KafkaConfig;

/// Longest single wait inside librdkafka while a batch is gathered.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// What a [`KafkaTransformer`] makes of each batch of input records.
#[async_trait]
pub trait Transform: Send + Sync {
    /// The messages to write for `batch` (records of one or more partitions, each partition in
    /// offset order). After an aborted transaction the same records come again, so the result
    /// must depend on the records alone. A transient error aborts the batch and retries it
    /// after a backoff; a permanent one stops the transformer with nothing of the batch
    /// visible. A record that cannot be used is best turned into a dead letter among the
    /// messages returned, so it leaves the input in the same transaction.
    async fn transform(&self, batch: &[Record]) -> Result<Vec<OutgoingMessage>, HandlerError>;

    /// Called once the broker acknowledged every message of `batch`'s transaction, before
    /// the batch's offsets join it and it commits: the last moment to refuse the batch, for a
    /// condition that must still hold when it commits (a lease still held, a deadline not
    /// passed). An error aborts the transaction, as a failed [`Transform::transform`] does.
    /// While it runs the transaction stays open, its messages written and hidden from
    /// `read_committed` readers. Does nothing by default.
    async fn before_commit(&self, batch: &[Record]) -> Result<(), HandlerError> {
        let _ = batch;
        Ok(())
    }
}

/// Settings of one [`KafkaTransformer`] instance.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransformerConfig {
    /// Consumer group of the input topics.
    pub group: String,
    /// This instance's name among the group's members (`client.id`).
    pub member: String,
    /// `transactional.id`: stable across restarts of this instance, unique among instances
    /// running at once. A restart with the same id aborts what the previous run left open.
    pub transactional_id: String,
    /// Topics read.
    pub inputs: Vec<String>,
    /// Most records in one transaction.
    pub max_batch: usize,
    /// How long a batch waits for its first record before the loop looks at shutdown.
    pub max_wait: Duration,
    /// `transaction.timeout.ms`: how long the broker keeps a transaction of a dead instance
    /// open (holding back `read_committed` readers) before aborting it.
    pub transaction_timeout: Duration,
    /// First wait after an aborted batch; doubles per consecutive abort up to 30 s.
    pub retry_backoff: Duration,
}

impl TransformerConfig {
    /// Settings for `member` of `group` reading `inputs`, with `transactional_id`; batches of
    /// up to 500 records, 10 s transaction timeout, 200 ms first backoff.
    pub fn new(
        group: impl Into<String>,
        member: impl Into<String>,
        transactional_id: impl Into<String>,
        inputs: &[&str],
    ) -> Self {
        Self {
            group: group.into(),
            member: member.into(),
            transactional_id: transactional_id.into(),
            inputs: inputs.iter().map(|t| (*t).to_owned()).collect(),
            max_batch: 500,
            max_wait: Duration::from_millis(200),
            transaction_timeout: Duration::from_secs(10),
            retry_backoff: Duration::from_millis(200),
        }
    }

    /// Sets [`TransformerConfig::max_batch`] (at least 1).
    pub fn with_max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// Sets [`TransformerConfig::transaction_timeout`].
    pub fn with_transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = timeout;
        self
    }
}

/// Counters of a running transformer; cheap to clone and read from another task.
#[derive(Debug, Clone, Default)]
pub struct TransformStats {
    inner: Arc<StatsInner>,
}

#[derive(Debug, Default)]
struct StatsInner {
    committed: AtomicU64,
    records_in: AtomicU64,
    records_out: AtomicU64,
    aborted: AtomicU64,
}

impl TransformStats {
    /// Transactions committed.
    pub fn committed(&self) -> u64 {
        self.inner.committed.load(Ordering::Relaxed)
    }
    /// Input records whose offsets were committed in a transaction.
    pub fn records_in(&self) -> u64 {
        self.inner.records_in.load(Ordering::Relaxed)
    }
    /// Messages written in committed transactions.
    pub fn records_out(&self) -> u64 {
        self.inner.records_out.load(Ordering::Relaxed)
    }
    /// Transactions aborted (each batch is then read again).
    pub fn aborted(&self) -> u64 {
        self.inner.aborted.load(Ordering::Relaxed)
    }
}

/// A consumer and a transactional producer working as one read-process-write loop.
pub struct KafkaTransformer {
    consumer: Arc<BaseConsumer>,
    /// The cluster's settings, for the namespace of topic names.
    kafka: KafkaConfig,
    producer: FutureProducer,
    config: TransformerConfig,
    request_timeout: Duration,
    stats: TransformStats,
}

impl KafkaTransformer {
    /// Builds both clients, registers the transactional id (fencing any earlier producer with
    /// it and aborting what that one left open) and subscribes to the inputs.
    pub async fn start(
        kafka: &KafkaConfig,
        config: TransformerConfig,
    ) -> Result<Self, TransformError> {
        let ns = &kafka.namespace;
        let consumer: BaseConsumer = kafka
            .transform_consumer(&ns.wire(&config.group), &config.member)
            .create()
            .map_err(|e| TransformError::Transport(transport(e, "")))?;
        let producer: FutureProducer = kafka
            .transactional_producer(
                &ns.wire(&config.transactional_id),
                config.transaction_timeout,
            )
            .create()
            .map_err(|e| TransformError::Transport(transport(e, "")))?;
        let timeout = kafka.request_timeout.max(config.transaction_timeout);
        let init = producer.clone();
        blocking(move || {
            init.init_transactions(timeout)
                .map_err(|e| transport(e, "init_transactions"))
        })
        .await
        .map_err(TransformError::Transport)?;
        let inputs: Vec<String> = config.inputs.iter().map(|t| ns.wire(t)).collect();
        let topics: Vec<&str> = inputs.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| TransformError::Transport(transport(e, "")))?;
        Ok(Self {
            consumer: Arc::new(consumer),
            kafka: kafka.clone(),
            producer,
            request_timeout: timeout,
            config,
            stats: TransformStats::default(),
        })
    }

    /// The counters, to read while [`KafkaTransformer::run`] goes on.
    pub fn stats(&self) -> TransformStats {
        self.stats.clone()
    }

    /// Transforms batch after batch until `shutdown` completes (a transaction under way is
    /// finished first), or until a fatal error: the transactional id taken over by another
    /// instance, a permanent error of the transform, or bad settings.
    pub async fn run(
        self,
        transform: &dyn Transform,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<TransformStats, TransformError> {
        tokio::pin!(shutdown);
        let mut aborts_in_a_row: u32 = 0;
        loop {
            let batch = tokio::select! {
                biased;
                () = &mut shutdown => return Ok(self.stats),
                batch = self.next_batch() => batch,
            };
            let batch = match batch {
                Ok(batch) if batch.is_empty() => continue,
                Ok(batch) => batch,
                Err(e) => {
                    tracing::warn!(error = %e, "polling the transformer's inputs");
                    tokio::time::sleep(self.backoff(1)).await;
                    continue;
                }
            };
            match self
                .transact(&batch, transform)
                .await
                .map_err(|s| self.with_cause(s))
            {
                Ok(()) => aborts_in_a_row = 0,
                Err(Step::Fatal(e)) => {
                    // Nothing of the open transaction may become visible; the broker would
                    // abort it after `transaction.timeout.ms` anyway.
                    let _ = self.abort(&batch).await;
                    return Err(e);
                }
                Err(Step::Abort(e)) => {
                    aborts_in_a_row = aborts_in_a_row.saturating_add(1);
                    tracing::warn!(error = %e, records = batch.len(), "transaction aborted");
                    self.abort(&batch).await?;
                    tokio::time::sleep(self.backoff(aborts_in_a_row)).await;
                }
            }
        }
    }

    /// A failed step seen through the producer's fatal error, if it has one: librdkafka may
    /// report a fencing to the step that met it only as "fatal".
    fn with_cause(&self, step: Step) -> Step {
        let Some((code, reason)) = self.producer.client().fatal_error() else {
            return step;
        };
        if is_fenced(code) {
            Step::Fatal(TransformError::Fenced { step: reason })
        } else {
            Step::Fatal(TransformError::Transport(TransportError::Rejected {
                reason,
            }))
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.config
            .retry_backoff
            .saturating_mul(factor)
            .min(Duration::from_secs(30))
    }

    /// Up to `max_batch` records: waits up to `max_wait` for the first, then takes only what
    /// librdkafka already holds.
    async fn next_batch(&self) -> Result<Vec<Record>, TransportError> {
        let consumer = self.consumer.clone();
        let (max, wait) = (self.config.max_batch, self.config.max_wait);
        blocking(move || {
            let deadline = std::time::Instant::now() + wait;
            let mut batch = Vec::new();
            while batch.len() < max {
                let timeout = if batch.is_empty() {
                    deadline
                        .saturating_duration_since(std::time::Instant::now())
                        .min(POLL_SLICE)
                } else {
                    Duration::ZERO
                };
                match consumer.poll(timeout) {
                    Some(Ok(m)) => batch.extend(to_record(&m)),
                    Some(Err(e)) if batch.is_empty() => return Err(transport(e, "")),
                    Some(Err(_)) => break,
                    None if timeout.is_zero() || std::time::Instant::now() >= deadline => break,
                    None => {}
                }
            }
            Ok(batch)
        })
        .await
    }

    /// One transaction: the transform's messages, acknowledged, then the batch's offsets, then
    /// the commit.
    async fn transact(&self, batch: &[Record], transform: &dyn Transform) -> Result<(), Step> {
        self.producer
            .begin_transaction()
            .map_err(|e| step_error(e, "begin_transaction"))?;
        // The transform sees the topics by the names it knows, whatever the namespace.
        let local = (!self.kafka.namespace.is_none()).then(|| {
            let mut local = batch.to_vec();
            self.kafka.localize(&mut local);
            local
        });
        let seen = local.as_deref().unwrap_or(batch);
        let messages = transform
            .transform(seen)
            .await
            .map_err(Step::from_handler)?;
        let topics = self.kafka.wire_topics(&messages);
        let mut deliveries = Vec::with_capacity(messages.len());
        for (m, topic) in messages.iter().zip(&topics) {
            match self.producer.send_result(future_record(topic, m)) {
                Ok(delivery) => deliveries.push(delivery),
                Err((e, _)) => return Err(step_error(e, topic)),
            }
        }
        for delivery in deliveries {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(step_error(e, "delivery")),
                Err(_) => return Err(step_error(KafkaError::Canceled, "delivery")),
            }
        }
        failpoint::hit(failpoint::KAFKA_TRANSFORM_BEFORE_COMMIT)
            .map_err(|e| Step::Abort(TransformError::Transport(TransportError::unavailable(e))))?;
        transform
            .before_commit(seen)
            .await
            .map_err(Step::from_handler)?;
        let offsets = next_offsets(batch).map_err(|e| step_error(e, "offsets"))?;
        let (consumer, producer, timeout) = (
            self.consumer.clone(),
            self.producer.clone(),
            self.request_timeout,
        );
        let outcome = tokio::task::spawn_blocking(move || {
            let group = consumer
                .group_metadata()
                .ok_or_else(|| step_error(KafkaError::NoMessageReceived, "group metadata"))?;
            producer
                .send_offsets_to_transaction(&offsets, &group, timeout)
                .map_err(|e| step_error(e, "send_offsets_to_transaction"))?;
            commit(&producer, timeout)
        })
        .await
        .map_err(|e| Step::Abort(TransformError::Transport(TransportError::unavailable(e))))?;
        outcome?;
        let s = &self.stats.inner;
        s.committed.fetch_add(1, Ordering::Relaxed);
        s.records_in
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        s.records_out
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Aborts the open transaction and moves the consumer back to the batch's first records,
    /// so they are read again (a partition revoked meanwhile is skipped: its new owner starts
    /// from the committed offset).
    async fn abort(&self, batch: &[Record]) -> Result<(), TransformError> {
        self.stats.inner.aborted.fetch_add(1, Ordering::Relaxed);
        let (consumer, producer, timeout) = (
            self.consumer.clone(),
            self.producer.clone(),
            self.request_timeout,
        );
        let firsts = first_offsets(batch);
        tokio::task::spawn_blocking(move || {
            if let Err(e) = producer.abort_transaction(timeout) {
                if let Step::Fatal(fatal) = step_error(e, "abort_transaction") {
                    return Err(fatal);
                }
            }
            for ((topic, partition), offset) in firsts {
                if let Err(e) = consumer.seek(&topic, partition, Offset::Offset(offset), timeout) {
                    tracing::debug!(error = %e, %topic, partition, "rewind skipped");
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| TransformError::Transport(TransportError::unavailable(e)))?
    }
}

/// Commits, trying again while librdkafka says the commit may still succeed.
fn commit(producer: &FutureProducer, timeout: Duration) -> Result<(), Step> {
    const ATTEMPTS: usize = 3;
    let mut last = None;
    for _ in 0..ATTEMPTS {
        match producer.commit_transaction(timeout) {
            Ok(()) => return Ok(()),
            Err(KafkaError::Transaction(e)) if e.is_retriable() && !e.txn_requires_abort() => {
                last = Some(KafkaError::Transaction(e));
            }
            Err(e) => return Err(step_error(e, "commit_transaction")),
        }
    }
    Err(step_error(
        last.unwrap_or(KafkaError::Canceled),
        "commit_transaction",
    ))
}

/// The offset after the last record of each partition of the batch.
fn next_offsets(batch: &[Record]) -> Result<TopicPartitionList, KafkaError> {
    let mut next: BTreeMap<(&str, i32), i64> = BTreeMap::new();
    for r in batch {
        let Ok(partition) = i32::try_from(r.partition) else {
            continue;
        };
        let slot = next.entry((r.topic.as_str(), partition)).or_insert(0);
        *slot = (*slot).max(r.offset + 1);
    }
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    }
    Ok(tpl)
}

/// The first offset of each partition of the batch.
fn first_offsets(batch: &[Record]) -> BTreeMap<(String, i32), i64> {
    let mut first: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for r in batch {
        let Ok(partition) = i32::try_from(r.partition) else {
            continue;
        };
        let slot = first
            .entry((r.topic.clone(), partition))
            .or_insert(r.offset);
        *slot = (*slot).min(r.offset);
    }
    first
}

impl std::fmt::Debug for KafkaTransformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransformer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
