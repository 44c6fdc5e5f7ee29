//! Publishing with an idempotent producer, returning only once every message is acknowledged.

use std::collections::{BTreeSet, HashSet};
use std::sync::Mutex;
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
    producer: FutureProducer,
    known: Mutex<HashSet<String>>,
    request_timeout: Duration,
    delivery_timeout: Duration,
}

impl KafkaPublisher {
    /// Builds the producer; it connects in the background.
    pub fn new(config: &KafkaConfig) -> Result<Self, TransportError> {
        let producer: FutureProducer = config.producer().create().map_err(|e| transport(e, ""))?;
        Ok(Self {
            producer,
            known: Mutex::new(HashSet::new()),
            request_timeout: config.request_timeout,
            delivery_timeout: config.delivery_timeout,
        })
    }

    fn is_known(&self, topic: &str) -> bool {
        self.known.lock().is_ok_and(|k| k.contains(topic))
    }

    /// Fails with `UnknownTopic` unless the brokers know every topic of the batch.
    async fn check_topics(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        let unknown: BTreeSet<&str> = batch
            .iter()
            .map(|m| m.topic.as_str())
            .filter(|t| !self.is_known(t))
            .collect();
        for topic in unknown {
            let producer = self.producer.clone();
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
    async fn enqueue(&self, m: &OutgoingMessage) -> Result<DeliveryFuture, TransportError> {
        let started = Instant::now();
        loop {
            let mut headers = OwnedHeaders::new_with_capacity(m.headers.len());
            for (name, value) in m.headers.iter() {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value),
                });
            }
            let mut record = FutureRecord::<str, [u8]>::to(&m.topic)
                .payload(m.payload.as_slice())
                .headers(headers);
            if let Some(key) = &m.key {
                record = record.key(key.as_str());
            }
            match self.producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if started.elapsed() < self.delivery_timeout =>
                {
                    // The producer's own thread keeps delivering; room frees up shortly.
                    tokio::time::sleep(QUEUE_FULL_BACKOFF).await;
                }
                Err((e, _)) => return Err(transport(e, &m.topic)),
            }
        }
    }
}

#[async_trait]
impl Publisher for KafkaPublisher {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.check_topics(batch).await?;
        let mut pending = Vec::with_capacity(batch.len());
        for m in batch {
            pending.push((m.topic.as_str(), self.enqueue(m).await?));
        }
        // Await every report, even after a failure, so `Ok` can only mean all were stored
        // and the first error names the first message that was not.
        let mut first_error = None;
        for (topic, delivery) in pending {
            let failure = match delivery.await {
                Ok(Ok(_)) => None,
                Ok(Err((e, _))) => Some(transport(e, topic)),
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
        first_error.map_or(Ok(()), Err)
    }
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher").finish_non_exhaustive()
    }
}
