//! Publishing with an idempotent producer, returning only once every message is acknowledged.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{OutgoingMessage, Publisher, TransportError};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use tokio::time::Instant;

use crate::error::transport;
use crate::meta::{blocking, topic_info};
use crate::KafkaConfig;

/// How long to wait before enqueueing again when librdkafka's local queue is full.
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(5);

/// Publishes through one idempotent librdkafka producer (`enable.idempotence`, `acks=all`,
/// `murmur2_random` partitioner, so a key lands where [`entrega_core::partition_for`] says).
///
/// Before a batch is enqueued, every topic in it is looked up once (then remembered): a batch
/// naming a missing topic fails with [`TransportError::UnknownTopic`] and enqueues nothing.
pub struct KafkaPublisher {
    producer: RwLock<FutureProducer>,
    config: KafkaConfig,
    known: Mutex<HashSet<String>>,
    request_timeout: Duration,
    delivery_timeout: Duration,
}

impl KafkaPublisher {
    /// Builds the producer; it connects in the background.
    pub fn new(config: &KafkaConfig) -> Result<Self, TransportError> {
        let producer: FutureProducer = config.producer().create().map_err(|e| transport(e, ""))?;
        Ok(Self {
            producer: RwLock::new(producer),
            config: config.clone(),
            known: Mutex::new(HashSet::new()),
            request_timeout: config.request_timeout,
            delivery_timeout: config.delivery_timeout,
        })
    }

    /// The producer in use.
    fn producer(&self) -> FutureProducer {
        self.producer
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces `used` with a new producer if it hit a fatal error, or was fenced (its epoch
    /// bump after a delivery timed out refused): librdkafka never recovers such an instance,
    /// every later message fails the same way.
    fn renew_if_broken(&self, used: &FutureProducer, failure: Option<&KafkaError>) {
        let fenced = failure
            .and_then(KafkaError::rdkafka_error_code)
            .filter(|c| {
                matches!(
                    c,
                    RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch
                )
            });
        let Some((code, reason)) = used
            .client()
            .fatal_error()
            .or_else(|| fenced.map(|c| (c, c.to_string())))
        else {
            return;
        };
        let mut current = self
            .producer
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !std::ptr::eq(current.client().native_ptr(), used.client().native_ptr()) {
            return;
        }
        match self.config.producer().create::<FutureProducer>() {
            Ok(fresh) => {
                tracing::warn!(?code, %reason, "kafka producer failed for good; replaced");
                *current = fresh;
            }
            Err(e) => tracing::warn!(error = %e, "replacing the failed kafka producer"),
        }
    }

    fn is_known(&self, topic: &str) -> bool {
        self.known.lock().is_ok_and(|k| k.contains(topic))
    }

    /// Fails with `UnknownTopic` unless the brokers know every topic of the batch.
    async fn check_topics(&self, topics: &[Cow<'_, str>]) -> Result<(), TransportError> {
        let unknown: BTreeSet<&str> = topics
            .iter()
            .map(AsRef::as_ref)
            .filter(|t| !self.is_known(t))
            .collect();
        for topic in unknown {
            let producer = self.producer();
            let name = topic.to_owned();
            let timeout = self.request_timeout;
            let info = blocking(move || {
                topic_info(producer.client(), &name, timeout).map_err(|e| transport(e, &name))
            })
            .await?;
            match info {
                Some(info) if !info.partitions.is_empty() => {
                    if let Ok(mut known) = self.known.lock() {
                        known.insert(topic.to_owned());
                    }
                }
                Some(_) => {
                    return Err(TransportError::unavailable(KafkaError::MetadataFetch(
                        RDKafkaErrorCode::LeaderNotAvailable,
                    )))
                }
                None => {
                    return Err(TransportError::UnknownTopic {
                        topic: topic.to_owned(),
                    })
                }
            }
        }
        Ok(())
    }

    /// Hands one message to librdkafka, waiting while its local queue is full.
    async fn enqueue(
        &self,
        producer: &FutureProducer,
        topic: &str,
        m: &OutgoingMessage,
    ) -> Result<DeliveryFuture, TransportError> {
        let started = Instant::now();
        loop {
            match producer.send_result(future_record(topic, m)) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if started.elapsed() < self.delivery_timeout =>
                {
                    // The producer's own thread keeps delivering; room frees up shortly.
                    tokio::time::sleep(QUEUE_FULL_BACKOFF).await;
                }
                Err((e, _)) => return Err(transport(e, topic)),
            }
        }
    }
}

/// `m` as librdkafka's record to `topic` (its topic as the broker knows it): key, headers
/// and payload as they are.
pub(crate) fn future_record<'a>(
    topic: &'a str,
    m: &'a OutgoingMessage,
) -> FutureRecord<'a, str, [u8]> {
    let mut headers = OwnedHeaders::new_with_capacity(m.headers.len());
    for (name, value) in m.headers.iter() {
        headers = headers.insert(Header {
            key: name,
            value: Some(value),
        });
    }
    let record = FutureRecord::<str, [u8]>::to(topic)
        .payload(m.payload.as_slice())
        .headers(headers);
    match &m.key {
        Some(key) => record.key(key.as_str()),
        None => record,
    }
}

#[async_trait]
impl Publisher for KafkaPublisher {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let topics = self.config.wire_topics(batch);
        self.check_topics(&topics).await?;
        let producer = self.producer();
        let mut pending = Vec::with_capacity(batch.len());
        for (m, topic) in batch.iter().zip(&topics) {
            match self.enqueue(&producer, topic, m).await {
                Ok(delivery) => pending.push((topic.as_ref(), delivery)),
                Err(e) => {
                    self.renew_if_broken(&producer, None);
                    return Err(e);
                }
            }
        }
        // Await every report, even after a failure, so `Ok` can only mean all were stored
        // and the first error names the first message that was not.
        let mut first_error = None;
        let mut first_kafka_error = None;
        for (topic, delivery) in pending {
            let failure = match delivery.await {
                Ok(Ok(_)) => None,
                Ok(Err((e, _))) => {
                    if first_kafka_error.is_none() {
                        first_kafka_error = Some(e.clone());
                    }
                    Some(transport(e, topic))
                }
                Err(canceled) => Some(TransportError::unavailable(canceled)),
            };
            if let Some(TransportError::UnknownTopic { topic }) = &failure {
                // Deleted since it was looked up: look it up again next time.
                if let Ok(mut known) = self.known.lock() {
                    known.remove(topic);
                }
            }
            if first_error.is_none() {
                first_error = failure;
            }
        }
        if first_error.is_some() {
            self.renew_if_broken(&producer, first_kafka_error.as_ref());
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher").finish_non_exhaustive()
    }
}
