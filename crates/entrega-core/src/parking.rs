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

/// A parked record as a store reads it back, numbers as the database holds them and the
/// headers as their JSON text; checked by [`ParkedRecord::from_stored`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredParked {
    /// Consumer group.
    pub group: String,
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i64,
    /// Offset.
    pub offset: i64,
    /// Key.
    pub key: Option<String>,
    /// Headers as JSON pairs ([`Headers::to_json`]).
    pub headers: String,
    /// Payload.
    pub payload: Vec<u8>,
    /// Attempts so far.
    pub attempts: i64,
    /// Next attempt, epoch ms.
    pub not_before_ms: i64,
    /// Last error.
    pub last_error: Option<String>,
    /// When it was parked, epoch ms.
    pub parked_at_ms: i64,
}

/// `grupo, topico, particion, desplazamiento, clave, cabeceras, carga, intentos,
/// no_antes_ms, ultimo_error, aparcado_ms` of `entrega_aparcados`, in the order and types
/// both stores select them.
pub type ParkedRow = (
    String,
    String,
    i64,
    i64,
    Option<String>,
    String,
    Vec<u8>,
    i64,
    i64,
    Option<String>,
    i64,
);

impl From<ParkedRow> for StoredParked {
    fn from(row: ParkedRow) -> Self {
        let (group, topic, partition, offset, key, headers, payload, attempts) =
            (row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7);
        Self {
            group,
            topic,
            partition,
            offset,
            key,
            headers,
            payload,
            attempts,
            not_before_ms: row.8,
            last_error: row.9,
            parked_at_ms: row.10,
        }
    }
}

impl ParkedRecord {
    /// A record from its stored columns; a value out of range or unreadable headers make a
    /// corrupt row.
    pub fn from_stored(stored: StoredParked) -> Result<Self, StoreError> {
        let StoredParked {
            group,
            topic,
            partition,
            offset,
            key,
            headers,
            payload,
            attempts,
            not_before_ms,
            last_error,
            parked_at_ms,
        } = stored;
        let corrupt = |reason: String| StoreError::Corrupt {
            table: "entrega_aparcados",
            reason,
        };
        Ok(Self {
            group,
            topic,
            partition: u32::try_from(partition).map_err(|e| corrupt(format!("particion: {e}")))?,
            offset,
            key,
            headers: Headers::from_json(&headers)
                .map_err(|e| corrupt(format!("cabeceras: {e}")))?,
            payload,
            attempts: u32::try_from(attempts).map_err(|e| corrupt(format!("intentos: {e}")))?,
            not_before_ms,
            last_error,
            parked_at_ms,
        })
    }
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
