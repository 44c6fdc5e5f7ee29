//! Appending to the log: one write transaction per batch, offsets allocated in commit order.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use entrega_core::{partition_for, OutgoingMessage, Publisher, TransportError};
use sqlx::SqliteConnection;

use super::admin::create_topic_in;
use super::SqliteLog;
use crate::connect::begin_immediate;
use crate::errors::{corrupt, transport};

impl SqliteLog {
    /// Partition count of `topic` inside the append transaction, creating the topic when
    /// configured to.
    async fn partitions_for_append(
        &self,
        conn: &mut SqliteConnection,
        topic: &str,
        now_ms: i64,
    ) -> Result<u32, TransportError> {
        let n: Option<i64> =
            sqlx::query_scalar("SELECT partitions FROM entrega_topics WHERE topic = ?")
                .bind(topic)
                .fetch_optional(&mut *conn)
                .await
                .map_err(transport)?;
        match (n, self.config.auto_create_partitions) {
            (Some(n), _) => u32::try_from(n).map_err(|_| {
                corrupt("entrega_topics", format!("`{topic}` has {n} partitions")).into()
            }),
            (None, Some(partitions)) => create_topic_in(conn, topic, partitions, now_ms).await,
            (None, None) => Err(TransportError::UnknownTopic {
                topic: topic.to_owned(),
            }),
        }
    }

    fn partition_of(&self, message: &OutgoingMessage, partitions: u32) -> u32 {
        match &message.key {
            Some(key) => partition_for(key, partitions),
            None => self.round_robin.fetch_add(1, Ordering::Relaxed) % partitions.max(1),
        }
    }
}

/// Appends the messages of one partition, in order, after reserving their offsets.
async fn append(
    conn: &mut SqliteConnection,
    topic: &str,
    partition: u32,
    messages: &[&OutgoingMessage],
    now_ms: i64,
) -> Result<(), TransportError> {
    let count = i64::try_from(messages.len()).unwrap_or(i64::MAX);
    // Bumping the counter takes SQLite's write lock (already held: BEGIN IMMEDIATE) until
    // commit, so no reader can see these offsets before every smaller one is committed.
    let end: Option<i64> = sqlx::query_scalar(
        "UPDATE entrega_partitions SET next_offset = next_offset + ?
         WHERE topic = ? AND partition_no = ?
         RETURNING next_offset",
    )
    .bind(count)
    .bind(topic)
    .bind(i64::from(partition))
    .fetch_optional(&mut *conn)
    .await
    .map_err(transport)?;
    let end = end.ok_or_else(|| {
        corrupt(
            "entrega_partitions",
            format!("partition {partition} of `{topic}` has no row"),
        )
    })?;
    for (offset, message) in (end - count..).zip(messages) {
        sqlx::query(
            "INSERT INTO entrega_log
                 (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(topic)
        .bind(i64::from(partition))
        .bind(offset)
        .bind(message.key.as_deref())
        .bind(message.headers.to_json())
        .bind(message.payload.as_slice())
        .bind(now_ms)
        .execute(&mut *conn)
        .await
        .map_err(transport)?;
    }
    Ok(())
}

#[async_trait]
impl Publisher for SqliteLog {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let now_ms = self.clock.now_ms();
        let mut tx = begin_immediate(&self.pool).await?;
        let mut partitions: HashMap<&str, u32> = HashMap::new();
        // Grouping keeps each partition's messages in batch order, which is all that per-key
        // ordering needs (a key always maps to one partition).
        let mut by_partition: BTreeMap<(&str, u32), Vec<&OutgoingMessage>> = BTreeMap::new();
        for message in batch {
            let topic = message.topic.as_str();
            let n = match partitions.get(topic) {
                Some(&n) => n,
                None => {
                    let n = self.partitions_for_append(&mut tx, topic, now_ms).await?;
                    partitions.insert(topic, n);
                    n
                }
            };
            let partition = self.partition_of(message, n);
            by_partition
                .entry((topic, partition))
                .or_default()
                .push(message);
        }
        for ((topic, partition), messages) in &by_partition {
            append(&mut tx, topic, *partition, messages, now_ms).await?;
        }
        tx.commit().await.map_err(transport)?;
        // Wake this process's subscribers now; pools from `connect` also signal on release.
        self.signals.log.fire();
        Ok(())
    }
}
