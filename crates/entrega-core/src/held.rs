//! Dead letters the broker refused: a letter too large for the dead-letter topic, or one
//! whose topic is missing and cannot be created, would otherwise be retried in place forever
//! and stall its partition. Instead the worker holds it in the consumer's own database, where
//! it stays visible (and counted) until an operator sends it on, and the partition goes on.
//!
//! A held letter is identified by the record it came from: group, source topic, partition
//! and offset. Holding the same record again after a crash keeps the first copy.

use async_trait::async_trait;

use crate::{Headers, OutgoingMessage, StoreError};

/// The record a held letter came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HeldId {
    /// Consumer group that held it.
    pub group: String,
    /// Topic the record was read from.
    pub topic: String,
    /// Partition it was read from.
    pub partition: u32,
    /// Offset it was read from.
    pub offset: i64,
}

/// One dead letter the broker refused, as the consumer keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLetter {
    /// The record it came from.
    pub id: HeldId,
    /// The dead letter as it was to be published: its destination, key, headers and the
    /// original payload.
    pub letter: OutgoingMessage,
    /// Why the broker refused it.
    pub refusal: String,
    /// When it was held, epoch milliseconds.
    pub held_at_ms: i64,
}

/// `group_id, topic, partition_no, log_offset, destination, msg_key, headers, payload, refusal,
/// held_at_ms` of `entrega_held_letters`, as both stores select them.
pub type HeldRow = (
    String,
    String,
    i64,
    i64,
    String,
    Option<String>,
    String,
    Vec<u8>,
    String,
    i64,
);

impl HeldLetter {
    /// A letter from its stored columns; an out-of-range partition or unreadable headers make
    /// a corrupt row.
    pub fn from_row(row: HeldRow) -> Result<Self, StoreError> {
        let (group, topic, partition, offset, destination, key, headers, payload, refusal, at) =
            row;
        let corrupt = |reason: String| StoreError::Corrupt {
            table: "entrega_held_letters",
            reason,
        };
        Ok(Self {
            id: HeldId {
                group,
                topic,
                partition: u32::try_from(partition)
                    .map_err(|e| corrupt(format!("partition_no: {e}")))?,
                offset,
            },
            letter: OutgoingMessage {
                topic: destination,
                key,
                headers: Headers::from_json(&headers)
                    .map_err(|e| corrupt(format!("headers: {e}")))?,
                payload,
            },
            refusal,
            held_at_ms: at,
        })
    }
}

/// Dead letters held in the consumer's database because the broker refused them.
#[async_trait]
pub trait HeldLetterStore: Send + Sync {
    /// Stores `letters`, each unless a letter of the same record is already held (that copy
    /// is kept).
    async fn hold(&self, letters: &[HeldLetter]) -> Result<(), StoreError>;

    /// Held letters, oldest first, at most `limit`.
    async fn list(&self, limit: usize) -> Result<Vec<HeldLetter>, StoreError>;

    /// How many letters are held.
    async fn count(&self) -> Result<u64, StoreError>;

    /// Forgets a held letter once it reached its destination; `false` if it was not held.
    async fn remove(&self, id: &HeldId) -> Result<bool, StoreError>;
}
