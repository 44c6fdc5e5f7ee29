//! Dead letters the broker refused, held in the consumer's database (`entrega_held_letters`,
//! inbox migration set): the store the worker writes them to, and the operator's way of
//! sending them on once the cause is mended (the topic created, its size limit raised).

use async_trait::async_trait;
use entrega_core::{HeldId, HeldLetter, HeldLetterStore, HeldRow, Publisher, StoreError};

use crate::db::{query, Db};

/// [`HeldLetterStore`] in any [`Db`] that has the inbox migration set.
#[derive(Debug, Clone)]
pub struct DbHeldLetters {
    db: Db,
}

impl DbHeldLetters {
    /// The held letters of the database behind `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

fn partition_of(p: u32) -> i32 {
    i32::try_from(p).unwrap_or(i32::MAX)
}

#[async_trait]
impl HeldLetterStore for DbHeldLetters {
    async fn hold(&self, letters: &[HeldLetter]) -> Result<(), StoreError> {
        if letters.is_empty() {
            return Ok(());
        }
        let mut tx = self.db.begin().await?;
        for held in letters {
            let (id, letter) = (&held.id, &held.letter);
            tx.execute(
                query(
                    "INSERT INTO entrega_held_letters (group_id, topic, partition_no, log_offset,
                        destination, msg_key, headers, payload, refusal, held_at_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                     ON CONFLICT DO NOTHING",
                )
                .bind(&id.group)
                .bind(&id.topic)
                .bind(partition_of(id.partition))
                .bind(id.offset)
                .bind(&letter.topic)
                .bind(&letter.key)
                .bind(letter.headers.to_json())
                .bind(letter.payload.as_slice())
                .bind(&held.refusal)
                .bind(held.held_at_ms),
            )
            .await?;
        }
        tx.commit().await
    }

    async fn list(&self, limit: usize) -> Result<Vec<HeldLetter>, StoreError> {
        let rows: Vec<HeldRow> = self
            .db
            .fetch_all(
                query(
                    "SELECT group_id, topic, CAST(partition_no AS BIGINT), log_offset, destination,
                        msg_key, headers, payload, refusal, held_at_ms
                     FROM entrega_held_letters
                     ORDER BY held_at_ms, group_id, topic, partition_no, log_offset LIMIT $1",
                )
                .bind(i64::try_from(limit).unwrap_or(i64::MAX)),
            )
            .await?;
        rows.into_iter().map(HeldLetter::from_row).collect()
    }

    async fn count(&self) -> Result<u64, StoreError> {
        let n: Option<i64> = self
            .db
            .scalar(query("SELECT COUNT(*) FROM entrega_held_letters"))
            .await?;
        Ok(n.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    async fn remove(&self, id: &HeldId) -> Result<bool, StoreError> {
        let n = self
            .db
            .execute(
                query(
                    "DELETE FROM entrega_held_letters
                     WHERE group_id = $1 AND topic = $2 AND partition_no = $3 AND log_offset = $4",
                )
                .bind(&id.group)
                .bind(&id.topic)
                .bind(partition_of(id.partition))
                .bind(id.offset),
            )
            .await?;
        Ok(n > 0)
    }
}

/// What sending held letters on came to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SentHeld {
    /// Letters the broker took, then forgotten here.
    pub sent: Vec<HeldId>,
    /// Letters the broker refused again, with why; they stay held.
    pub refused: Vec<(HeldId, String)>,
}

/// Publishes up to `limit` held letters to their dead-letter topics, oldest first, one at a
/// time; each one the broker confirms is forgotten, each one it refuses stays held. A crash
/// between the two leaves a letter both published and held: sending it again publishes a
/// second copy of the same dead letter, which a replay's idempotent consumer absorbs.
pub async fn send_held(
    store: &dyn HeldLetterStore,
    publisher: &dyn Publisher,
    limit: usize,
) -> Result<SentHeld, StoreError> {
    let mut report = SentHeld::default();
    for held in store.list(limit).await? {
        match publisher.publish(std::slice::from_ref(&held.letter)).await {
            Ok(()) => {
                store.remove(&held.id).await?;
                report.sent.push(held.id);
            }
            Err(e) => report.refused.push((held.id, e.to_string())),
        }
    }
    Ok(report)
}
