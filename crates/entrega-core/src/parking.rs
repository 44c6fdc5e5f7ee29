//! Parking for ordered retries: when a message of key K fails, K's messages wait here, in
//! offset order, until the head succeeds or is dead-lettered, while other keys flow.
//!
//! A parked record is identified by its group, topic, partition and offset. Rows are written
//! before the source offset commits, so parking the same record again after a crash must be
//! harmless: [`ParkingStore::park`] keeps the first copy.

use async_trait::async_trait;

use crate::{Headers, StoreError};

/// One parked record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedRecord {
    /// Consumer group that parked it.
    pub group: String,
    /// Topic it was read from.
    pub topic: String,
    /// Partition it was read from.
    pub partition: u32,
    /// Offset it was read from.
    pub offset: i64,
    /// Its key (`None` for records without a key: they park as one key per partition).
    pub key: Option<String>,
    /// Headers as published.
    pub headers: Headers,
    /// The message body, unchanged.
    pub payload: Vec<u8>,
    /// Attempts made so far (0 for a record parked behind a failed head).
    pub attempts: u32,
    /// Earliest time of the next attempt, epoch milliseconds.
    pub not_before_ms: i64,
    /// The last error, if an attempt was made.
    pub last_error: Option<String>,
    /// When it was parked, epoch milliseconds.
    pub parked_at_ms: i64,
}

/// Where, in one subscription, a parked record sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParkedAt<'a> {
    /// Consumer group.
    pub group: &'a str,
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: u32,
}

/// Durable per-key parking, in the consumer's database.
#[async_trait]
pub trait ParkingStore: Send + Sync {
    /// Stores `records`, each unless a record with the same group, topic, partition and
    /// offset is already parked (that copy, with its attempts, is kept).
    async fn park(&self, records: &[ParkedRecord]) -> Result<(), StoreError>;

    /// The keys with parked records in one partition.
    async fn parked_keys(&self, at: ParkedAt<'_>) -> Result<Vec<Option<String>>, StoreError>;

    /// The head (lowest offset) of `key`'s parked records in one partition, if any.
    async fn head(
        &self,
        at: ParkedAt<'_>,
        key: Option<&str>,
    ) -> Result<Option<ParkedRecord>, StoreError>;

    /// Records another failed attempt of a parked record.
    async fn reschedule(
        &self,
        at: ParkedAt<'_>,
        offset: i64,
        attempts: u32,
        not_before_ms: i64,
        last_error: &str,
    ) -> Result<(), StoreError>;

    /// Removes a parked record once its outcome is final (applied or dead-lettered).
    async fn remove(&self, at: ParkedAt<'_>, offset: i64) -> Result<(), StoreError>;

    /// Every parked record of a group and topic, in partition and offset order, at most
    /// `limit`; for operators.
    async fn list(
        &self,
        group: &str,
        topic: &str,
        limit: usize,
    ) -> Result<Vec<ParkedRecord>, StoreError>;
}
