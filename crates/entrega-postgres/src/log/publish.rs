//! Appending to the log: offsets allocated under the partition row lock, in commit order.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use entrega_core::{partition_for, OutgoingMessage, Publisher, TransportError};
use sqlx::postgres::PgConnection;

use super::{partition_i32, PgLog, LOG_CHANNEL};
use crate::errors::transport;

/// Appends a run of messages to one partition with one statement.
///
/// The `UPDATE` reserves `n` offsets and keeps the partition row locked until the
/// transaction ends, so a concurrent append to the same partition waits and takes the
/// offsets after ours: offsets become visible in the order they were allocated, and a reader
/// that has seen offset `k` can never later find a smaller one appear (ARCHITECTURE rule 1).
/// The notification is queued in the same transaction and delivered at commit.
const APPEND: &str = "
WITH p AS (
    UPDATE entrega_partitions SET next_offset = next_offset + $3
    WHERE topic = $1 AND partition_no = $2
    RETURNING next_offset - $3 AS base, pg_notify($8, $1) AS notified
), ins AS (
    INSERT INTO entrega_log (topic, partition_no, log_offset, msg_key, headers, payload, appended_at_ms)
    SELECT $1, $2, p.base + m.ord - 1, m.k, m.h, m.b, $7
    FROM p, UNNEST($4::text[], $5::text[], $6::bytea[]) WITH ORDINALITY AS m(k, h, b, ord)
    RETURNING 1
)
SELECT count(*) FROM ins";

async fn append(
    conn: &mut PgConnection,
    topic: &str,
    partition: u32,
    messages: &[&OutgoingMessage],
    now_ms: i64,
) -> Result<usize, TransportError> {
    let keys: Vec<Option<&str>> = messages.iter().map(|m| m.key.as_deref()).collect();
    let headers: Vec<String> = messages.iter().map(|m| m.headers.to_json()).collect();
    let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.as_slice()).collect();
    let n = i64::try_from(messages.len()).unwrap_or(i64::MAX);
    let written: i64 = sqlx::query_scalar(APPEND)
        .bind(topic)
        .bind(partition_i32(partition)?)
        .bind(n)
        .bind(&keys)
        .bind(&headers)
        .bind(&payloads)
        .bind(now_ms)
        .bind(LOG_CHANNEL)
        .fetch_one(conn)
        .await
        .map_err(transport)?;
    Ok(usize::try_from(written).unwrap_or(0))
}

#[async_trait]
impl Publisher for PgLog {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut counts: HashMap<&str, u32> = HashMap::new();
        // Keyless messages of one call go to one partition per topic (like Kafka's sticky
        // partitioner): one statement instead of one per partition.
        let mut keyless: HashMap<&str, u32> = HashMap::new();
        // Sorted by (topic, partition): concurrent publishers lock partition rows in the same
        // order and cannot deadlock. Within a group messages keep the batch order.
        let mut groups: BTreeMap<(&str, u32), Vec<&OutgoingMessage>> = BTreeMap::new();
        for m in batch {
            let topic = m.topic.as_str();
            let n = match counts.get(topic) {
                Some(n) => *n,
                None => {
                    let n = self.require_topic(topic).await?;
                    counts.insert(topic, n);
                    n
                }
            };
            let partition = match &m.key {
                Some(key) => partition_for(key, n),
                None => *keyless
                    .entry(topic)
                    .or_insert_with(|| self.round_robin.fetch_add(1, Ordering::Relaxed) % n),
            };
            groups.entry((topic, partition)).or_default().push(m);
        }
        let now = self.clock.now_ms();
        if let [((topic, partition), messages)] = groups.iter().collect::<Vec<_>>()[..] {
            // One partition: the append alone is atomic and commits on its own, holding the
            // partition row's lock until then; BEGIN and COMMIT would only add round trips.
            // sqlx reads every reply up to ReadyForQuery, so `Ok` comes after the commit.
            let mut conn = self.pool.acquire().await.map_err(transport)?;
            let written = append(&mut conn, topic, *partition, messages, now).await?;
            return self.check_written(topic, written, messages.len());
        }
        let mut tx = self.pool.begin().await.map_err(transport)?;
        for ((topic, partition), messages) in &groups {
            let written = append(&mut tx, topic, *partition, messages, now).await?;
            self.check_written(topic, written, messages.len())?;
        }
        // Commit is the durable confirmation the Publisher contract promises.
        tx.commit().await.map_err(transport)
    }
}

impl PgLog {
    fn check_written(
        &self,
        topic: &str,
        written: usize,
        sent: usize,
    ) -> Result<(), TransportError> {
        if written == sent {
            return Ok(());
        }
        // The partition row is gone: the topic was dropped behind our cache.
        self.forget(topic);
        Err(TransportError::UnknownTopic {
            topic: topic.to_owned(),
        })
    }
}
