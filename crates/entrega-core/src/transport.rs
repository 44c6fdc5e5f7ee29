//! The transport seams: publishing with confirmation, and consuming as a group member.

use std::time::Duration;

use async_trait::async_trait;

use crate::{Headers, TransportError};

/// A message to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    /// Destination topic.
    pub topic: String,
    /// Partitioning key (`agregado_id` for domain events); `None` spreads messages.
    pub key: Option<String>,
    /// Headers (`tipo`, `id_evento`, ...).
    pub headers: Headers,
    /// The message body, usually an [`crate::Envelope`] in its wire form.
    pub payload: Vec<u8>,
}

/// A message read from a partitioned log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Topic it was read from.
    pub topic: String,
    /// Partition within the topic.
    pub partition: u32,
    /// Position within the partition.
    pub offset: i64,
    /// Partitioning key, if any.
    pub key: Option<String>,
    /// Headers as published.
    pub headers: Headers,
    /// The message body.
    pub payload: Vec<u8>,
    /// Append time in epoch milliseconds.
    pub timestamp_ms: i64,
}

/// Publishes messages and returns only once the transport has durably confirmed all of them.
///
/// An `Ok` means every message is stored by the transport. An `Err` means some may be and some
/// may not: callers must treat the whole batch as unconfirmed and publish it again later, which
/// is safe because consumers are idempotent.
#[async_trait]
pub trait Publisher: Send + Sync {
    /// Publishes the batch, preserving the order of messages that share a key.
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError>;
}

/// Creates topics. Separate from [`Publisher`] because not every deployment may create topics.
#[async_trait]
pub trait TopicAdmin: Send + Sync {
    /// Creates the topic with `partitions` partitions if it does not exist; returns its
    /// actual partition count (which may differ if it already existed).
    async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32, TransportError>;
}

/// Joins consumer groups.
#[async_trait]
pub trait Subscriber: Send + Sync {
    /// Joins `group` on `topic` as `member` (unique per running instance).
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, TransportError>;
}

/// One member's view of a consumer group on one topic.
///
/// Records of one partition come in offset order. Offsets are committed explicitly, after
/// processing, as the *next* offset to read (Kafka's convention). Partitions may be taken
/// away or handed over on any `poll`; a commit for a partition no longer held fails with
/// [`TransportError::NotAssigned`] and the records will be delivered again to the new owner.
#[async_trait]
pub trait Subscription: Send {
    /// Waits up to `wait` for records from the partitions this member holds.
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Record>, TransportError>;

    /// Commits `next_offset` (last processed offset + 1) for each listed partition.
    async fn commit(&mut self, offsets: &[(u32, i64)]) -> Result<(), TransportError>;

    /// Moves the read position of a held partition, e.g. to deliver a record again.
    fn seek(&mut self, partition: u32, offset: i64);

    /// Holds back a partition until `until` elapses (no records from it are returned).
    fn pause_for(&mut self, partition: u32, until: Duration);

    /// Partitions held at the last poll.
    fn assignment(&self) -> Vec<u32>;

    /// Leaves the group, releasing held partitions so others take them at once.
    async fn close(&mut self) -> Result<(), TransportError>;
}
