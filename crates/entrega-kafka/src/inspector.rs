//! Reading a topic's positions and records without joining any consumer group.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega_core::{LogInspector, Record, TransportError};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::assignment::{assigned_partitions, subscribes_to};
use crate::error::{invalid, transport};
use crate::meta::{after, blocking, partition_id, ready_topic_info};
use crate::record::to_record;
use crate::KafkaConfig;

/// End offsets, committed offsets and direct reads for operators, tooling and tests.
///
/// Reads use one consumer that is assigned the partition directly and never subscribes, so
/// no group is joined and nothing is committed. Committed offsets are fetched by a client
/// that only names the group.
pub struct KafkaInspector {
    config: KafkaConfig,
    reader: Arc<Mutex<Option<BaseConsumer>>>,
}

impl KafkaInspector {
    /// An inspector of the cluster in `config`; its clients are made on first use.
    pub fn new(config: KafkaConfig) -> Self {
        Self {
            config,
            reader: Arc::new(Mutex::new(None)),
        }
    }
}

/// The reader consumer, created on first use. Blocking.
fn with_reader<T>(
    config: &KafkaConfig,
    slot: &Mutex<Option<BaseConsumer>>,
    f: impl FnOnce(&BaseConsumer) -> Result<T, TransportError>,
) -> Result<T, TransportError> {
    let mut guard = slot
        .lock()
        .map_err(|_| invalid("inspector reader poisoned by an earlier failure"))?;
    if guard.is_none() {
        // The group is only named, never joined: librdkafka needs one to assign partitions.
        let group = format!("{}.inspector", config.client_id);
        let consumer: BaseConsumer = config
            .reader(&group)
            .create()
            .map_err(|e| transport(e, ""))?;
        *guard = Some(consumer);
    }
    match guard.as_ref() {
        Some(consumer) => f(consumer),
        None => Err(invalid("inspector reader missing")),
    }
}

/// How long the queue must stay empty, once the reported end is reached, to be sure the last
/// fetched batch has been handed over in full.
const DRAIN_QUIET: Duration = Duration::from_millis(20);

/// Records of one partition and where it ends.
struct Scan {
    records: Vec<Record>,
    end: i64,
}

/// The partition's low and high watermarks. A partition whose leader was just elected may
/// answer "not leader" for a moment after the metadata names it: asked again, within
/// `timeout`. Blocking.
fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<(i64, i64), KafkaError> {
    let deadline = after(timeout);
    loop {
        match consumer.fetch_watermarks(topic, partition, timeout) {
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::NotLeaderForPartition | RDKafkaErrorCode::LeaderNotAvailable,
            )) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => return other,
        }
    }
}

/// Reads up to `max` records of one partition from `from` on, and finds its true end. Blocking.
///
/// Kafka reports the end (high watermark) as the offset after the last record. Some
/// Kafka-protocol brokers (tansu) report the base offset of the last record batch plus one
/// instead, which hides the rest of that batch. So the scan always fetches from the last batch
/// reported at the latest and reads until the records fetched run out: on Kafka that costs one
/// record, elsewhere it finds the records the watermark leaves out.
fn scan(
    consumer: &BaseConsumer,
    topic: &str,
    partition: u32,
    from: i64,
    max: usize,
    timeout: Duration,
) -> Result<Scan, TransportError> {
    let id = partition_id(partition)?;
    let (low, high) = match watermarks(consumer, topic, id, timeout) {
        Ok(marks) => marks,
        Err(e) => {
            return match transport(e, topic) {
                TransportError::UnknownTopic { .. } => Ok(Scan {
                    records: Vec::new(),
                    end: 0,
                }),
                other => Err(other),
            }
        }
    };
    if high <= low || max == 0 {
        return Ok(Scan {
            records: Vec::new(),
            end: high,
        });
    }
    let start = from.max(low);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, id, Offset::Offset(start.min(high - 1)))
        .map_err(|e| transport(e, topic))?;
    consumer.assign(&tpl).map_err(|e| transport(e, topic))?;
    let result = fetch_until_end(consumer, topic, partition, start, high, max, timeout);
    // Stop fetching in the background; the next scan assigns what it needs.
    let _ = consumer.unassign();
    result
}

fn fetch_until_end(
    consumer: &BaseConsumer,
    topic: &str,
    partition: u32,
    start: i64,
    high: i64,
    max: usize,
    timeout: Duration,
) -> Result<Scan, TransportError> {
    let deadline = after(timeout);
    let mut records: Vec<Record> = Vec::new();
    let mut next = i64::MIN;
    while records.len() < max {
        let reached = next >= high;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(TransportError::unavailable(KafkaError::NoMessageReceived));
        }
        let wait = if reached {
            DRAIN_QUIET
        } else {
            left.min(Duration::from_millis(200))
        };
        match consumer.poll(wait) {
            None if reached => break,
            None => {
                // A transaction's commit or abort marker takes an offset no record is
                // handed over for; the consumer's position still moves past it.
                if position(consumer, topic, partition).is_some_and(|p| p >= high) {
                    next = next.max(high);
                }
            }
            Some(Ok(m)) => {
                let Some(r) = to_record(&m) else { continue };
                // Anything left over from an earlier assignment is not ours.
                if r.topic != topic || r.partition != partition || r.offset < next {
                    continue;
                }
                next = r.offset + 1;
                if r.offset >= start {
                    records.push(r);
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => return Err(transport(e, topic)),
        }
    }
    Ok(Scan {
        records,
        end: next.max(high),
    })
}

/// The consumer's position in `partition` of `topic`: the offset after the last message
/// or transaction marker it went past.
fn position(consumer: &BaseConsumer, topic: &str, partition: u32) -> Option<i64> {
    let id = i32::try_from(partition).ok()?;
    let list = consumer.position().ok()?;
    match list.find_partition(topic, id)?.offset() {
        Offset::Offset(n) => Some(n),
        _ => None,
    }
}

#[async_trait]
impl LogInspector for KafkaInspector {
    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        let topic = self.config.namespace.wire(topic);
        let (config, slot) = (self.config.clone(), self.reader.clone());
        blocking(move || {
            with_reader(&config, &slot, |consumer| {
                let timeout = config.request_timeout;
                let info = ready_topic_info(consumer.client(), &topic, timeout)
                    .map_err(|e| transport(e, &topic))?;
                let Some(info) = info else {
                    return Ok(Vec::new());
                };
                info.partitions
                    .into_iter()
                    .map(|p| {
                        let found = scan(consumer, &topic, p, i64::MAX, usize::MAX, timeout)?;
                        Ok((p, found.end))
                    })
                    .collect()
            })
        })
        .await
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        let (config, slot) = (self.config.clone(), self.reader.clone());
        let ns = &self.config.namespace;
        let (group, topic) = (ns.wire(group), ns.wire(topic));
        blocking(move || {
            let timeout = config.request_timeout;
            let info = with_reader(&config, &slot, |consumer| {
                ready_topic_info(consumer.client(), &topic, timeout)
                    .map_err(|e| transport(e, &topic))
            })?;
            let Some(info) = info else {
                return Ok(Vec::new());
            };
            let mut tpl = TopicPartitionList::new();
            for p in &info.partitions {
                tpl.add_partition(&topic, partition_id(*p)?);
            }
            // A client that names the group but never subscribes only asks for its offsets.
            let asker: BaseConsumer = config
                .reader(&group)
                .create()
                .map_err(|e| transport(e, &topic))?;
            let offsets = asker
                .committed_offsets(tpl, timeout)
                .map_err(|e| transport(e, &topic))?;
            Ok(offsets
                .elements_for_topic(&topic)
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(n) => Some((u32::try_from(e.partition()).ok()?, n)),
                    _ => None,
                })
                .collect())
        })
        .await
    }

    /// The members the group coordinator lists for `group` subscribed to `topic`, those
    /// holding no partition included, and counted while the group rebalances too.
    async fn members(&self, group: &str, topic: &str) -> Result<Option<u32>, TransportError> {
        let (config, slot) = (self.config.clone(), self.reader.clone());
        let ns = &self.config.namespace;
        let (group, topic) = (ns.wire(group), ns.wire(topic));
        blocking(move || {
            with_reader(&config, &slot, |consumer| {
                let groups = consumer
                    .fetch_group_list(Some(&group), config.request_timeout)
                    .map_err(|e| transport(e, &topic))?;
                let members = groups
                    .groups()
                    .iter()
                    .filter(|g| g.name() == group)
                    .flat_map(|g| g.members())
                    .filter(|m| {
                        m.metadata().is_some_and(|s| subscribes_to(s, &topic))
                            || m.assignment()
                                .is_some_and(|a| !assigned_partitions(a, &topic).is_empty())
                    })
                    .count();
                Ok(Some(u32::try_from(members).unwrap_or(u32::MAX)))
            })
        })
        .await
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, TransportError> {
        let topic = self.config.namespace.wire(topic);
        let (config, slot) = (self.config.clone(), self.reader.clone());
        blocking(move || {
            with_reader(&config, &slot, |consumer| {
                let found = scan(
                    consumer,
                    &topic,
                    partition,
                    from,
                    max,
                    config.request_timeout,
                )?;
                let mut records = found.records;
                config.localize(&mut records);
                Ok(records)
            })
        })
        .await
    }
}

impl std::fmt::Debug for KafkaInspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaInspector").finish_non_exhaustive()
    }
}
