//! One group member: a `BaseConsumer` polled on tokio's blocking pool, with a local buffer
//! so no fetched record is lost when a `poll` is cancelled.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega_core::{Record, Subscription, TransportError};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::error::{commit_error, invalid, transport};
use crate::group::{lock, GroupContext, Shared};
use crate::meta::{after, blocking, partition_id};
use crate::record::to_record;

/// Longest single wait inside librdkafka, so pauses that end are noticed promptly.
const POLL_SLICE: Duration = Duration::from_millis(100);

pub(crate) type GroupConsumer = BaseConsumer<GroupContext>;

/// A subscription of one member to one topic; see [`crate::KafkaSubscriber`].
pub struct KafkaSubscription {
    /// The topic as the broker knows it.
    topic: String,
    /// The topic as the subscriber named it, given to the records handed out.
    local_topic: String,
    consumer: Option<Arc<GroupConsumer>>,
    state: Shared,
    /// Serializes librdkafka polls: a poll whose future was dropped may still be running.
    polling: Arc<Mutex<()>>,
    close_timeout: Duration,
}

impl KafkaSubscription {
    pub(crate) fn new(
        topic: &str,
        local_topic: &str,
        consumer: GroupConsumer,
        state: Shared,
        close_timeout: Duration,
    ) -> Self {
        Self {
            topic: topic.to_owned(),
            local_topic: local_topic.to_owned(),
            consumer: Some(Arc::new(consumer)),
            state,
            polling: Arc::new(Mutex::new(())),
            close_timeout,
        }
    }

    fn consumer(&self) -> Result<Arc<GroupConsumer>, TransportError> {
        self.consumer
            .clone()
            .ok_or_else(|| invalid("the subscription is closed"))
    }
}

/// Hands pending seeks to librdkafka and resumes partitions whose pause ended. Blocking.
fn apply_controls(consumer: &GroupConsumer, topic: &str, state: &Shared) -> Result<(), KafkaError> {
    let now = Instant::now();
    let (seeks, resumes) = {
        let mut s = lock(state);
        let ended: Vec<u32> = s
            .paused
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(p, _)| *p)
            .collect();
        for p in &ended {
            s.paused.remove(p);
        }
        (std::mem::take(&mut s.seeks), ended)
    };
    if !resumes.is_empty() {
        let mut tpl = TopicPartitionList::new();
        for p in &resumes {
            if let Ok(id) = i32::try_from(*p) {
                tpl.add_partition(topic, id);
            }
        }
        consumer.resume(&tpl)?;
    }
    for (p, offset) in seeks {
        let Ok(id) = i32::try_from(p) else { continue };
        if let Err(e) = consumer.seek(topic, id, Offset::Offset(offset), POLL_SLICE * 10) {
            // Keep it pending (unless a newer seek came in): records of the partition stay
            // held back until it lands, so nothing past the wanted offset is delivered.
            lock(state).seeks.entry(p).or_insert(offset);
            return Err(e);
        }
    }
    Ok(())
}

/// Polls librdkafka into the buffer until `max` records are ready or `wait` has passed
/// without any. Blocking.
fn fill(
    consumer: &GroupConsumer,
    topic: &str,
    state: &Shared,
    max: usize,
    wait: Duration,
) -> Result<(), TransportError> {
    let deadline = after(wait);
    loop {
        apply_controls(consumer, topic, state).map_err(|e| transport(e, topic))?;
        let now = Instant::now();
        let ready = lock(state).ready(now);
        if ready >= max {
            return Ok(());
        }
        let timeout = if ready > 0 {
            Duration::ZERO
        } else {
            deadline.saturating_duration_since(now).min(POLL_SLICE)
        };
        match consumer.poll(timeout) {
            None if timeout.is_zero() => return Ok(()),
            None => {}
            Some(Ok(m)) => {
                let Some(record) = to_record(&m) else {
                    continue;
                };
                let mut s = lock(state);
                // Records of a partition no longer held, or awaiting a seek, are dropped:
                // the new owner, or the seek, reads them again.
                if s.held.contains(&record.partition) && !s.seeks.contains_key(&record.partition) {
                    s.buffer.push_back(record);
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => {
                let error = transport(e, topic);
                if !error.is_transient() {
                    return Err(error);
                }
                // Broker-down and transport events are news, not failures of this poll:
                // librdkafka reconnects by itself, and events queued during an outage would
                // otherwise each cost the caller a backoff after the brokers are back.
                tracing::warn!(%topic, %error, "consumer event");
                if ready > 0 {
                    return Ok(());
                }
            }
        }
    }
}

/// Leaves the group and waits (bounded) until librdkafka says the consumer is closed. Blocking.
///
/// rust-rdkafka's `Drop` of a group consumer closes its queue again and then waits, without
/// a bound, until it is closed; after this close its second attempt is refused and logged at
/// ERROR under the target `rdkafka::consumer::base_consumer` ("Failed to close consumer queue
/// on drop"). Leaving the close to that `Drop` would avoid the line but could hang a shutdown
/// on an unreachable cluster, so the close stays here, bounded, and the line is expected:
/// filter that target's ERROR level (km0 does) to keep a clean shutdown quiet.
fn leave(consumer: &GroupConsumer, timeout: Duration) -> Result<(), KafkaError> {
    consumer.unsubscribe();
    consumer.close_queue()?;
    let deadline = after(timeout);
    while !consumer.closed() && Instant::now() < deadline {
        // Serves the revoke callback and the leave-group round trip.
        let _ = consumer.poll(POLL_SLICE);
    }
    Ok(())
}

#[async_trait]
impl Subscription for KafkaSubscription {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Record>, TransportError> {
        let consumer = self.consumer()?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let (state, polling, topic) =
            (self.state.clone(), self.polling.clone(), self.topic.clone());
        blocking(move || {
            let _turn = polling
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            fill(&consumer, &topic, &state, max, wait)
        })
        .await?;
        let mut records = lock(&self.state).take(max, Instant::now());
        if self.local_topic != self.topic {
            for r in &mut records {
                r.topic.clone_from(&self.local_topic);
            }
        }
        Ok(records)
    }

    async fn commit(&mut self, offsets: &[(u32, i64)]) -> Result<(), TransportError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let consumer = self.consumer()?;
        let mut tpl = TopicPartitionList::new();
        {
            let s = lock(&self.state);
            for (p, next) in offsets {
                if !s.held.contains(p) {
                    return Err(TransportError::NotAssigned {
                        topic: self.topic.clone(),
                        partition: *p,
                    });
                }
                if *next < 0 {
                    return Err(invalid(format!(
                        "offset {next} of partition {p} is negative"
                    )));
                }
                tpl.add_partition_offset(&self.topic, partition_id(*p)?, Offset::Offset(*next))
                    .map_err(|e| transport(e, &self.topic))?;
            }
        }
        let topic = self.topic.clone();
        let first = offsets.first().map_or(0, |(p, _)| *p);
        blocking(move || {
            consumer
                .commit(&tpl, CommitMode::Sync)
                .map_err(|e| commit_error(e, &topic, first))?;
            for e in tpl.elements() {
                if let Err(err) = e.error() {
                    let p = u32::try_from(e.partition()).unwrap_or(first);
                    return Err(commit_error(err, &topic, p));
                }
            }
            Ok(())
        })
        .await
    }

    fn seek(&mut self, partition: u32, offset: i64) {
        let mut s = lock(&self.state);
        if !s.held.contains(&partition) {
            return;
        }
        s.buffer.retain(|r| r.partition != partition);
        s.seeks.insert(partition, offset.max(0));
    }

    fn pause_for(&mut self, partition: u32, until: Duration) {
        let Some(consumer) = self.consumer.as_ref() else {
            return;
        };
        let mut s = lock(&self.state);
        if !s.held.contains(&partition) {
            return;
        }
        s.paused.insert(partition, after(until));
        drop(s);
        // Stops fetching; buffered records stay and are held back by the local pause.
        if let Ok(id) = i32::try_from(partition) {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.topic, id);
            if let Err(e) = consumer.pause(&tpl) {
                tracing::debug!(topic = %self.topic, partition, error = %e, "pause failed");
            }
        }
    }

    fn assignment(&self) -> Vec<u32> {
        lock(&self.state).held.iter().copied().collect()
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        let Some(consumer) = self.consumer.take() else {
            return Ok(());
        };
        let (state, timeout, topic) = (self.state.clone(), self.close_timeout, self.topic.clone());
        let polling = self.polling.clone();
        blocking(move || {
            let _turn = polling
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let left = leave(&consumer, timeout);
            let mut s = lock(&state);
            s.held.clear();
            s.buffer.clear();
            drop(s);
            drop(consumer);
            left.map_err(|e| transport(e, &topic))
        })
        .await
    }
}

impl Drop for KafkaSubscription {
    fn drop(&mut self) {
        // Dropping the consumer leaves the group and waits for it: keep that wait off the
        // async runtime's threads.
        if let Some(consumer) = self.consumer.take() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn_blocking(move || drop(consumer));
            }
        }
    }
}

impl std::fmt::Debug for KafkaSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSubscription")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}
