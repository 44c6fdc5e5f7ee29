//! Topics and reading the log without a group: creating a topic and its partitions, the
//! partition-count cache, end and committed offsets, records from an offset on.

use async_trait::async_trait;
use entrega_core::{Headers, LogInspector, Record, StoreError, TopicAdmin, TransportError};

use super::{partition_of, DbLog};
use crate::db::{query, query_each};
use crate::store::int4;

/// `partition_no, log_offset, msg_key, headers, payload, appended_at_ms` of `entrega_log`.
pub(super) const RECORD_COLUMNS: &str =
    "CAST(partition_no AS BIGINT), log_offset, msg_key, headers, payload, appended_at_ms";

/// A row selected with [`RECORD_COLUMNS`].
pub(super) type RecordRow = (i64, i64, Option<String>, String, Vec<u8>, i64);

/// The record of a row of `topic`.
pub(super) fn record(topic: &str, row: RecordRow) -> Result<Record, StoreError> {
    let (partition, offset, key, headers, payload, timestamp_ms) = row;
    let headers = Headers::from_json(&headers).map_err(|e| StoreError::Corrupt {
        table: "entrega_log",
        reason: format!("`{topic}` {partition}@{offset}: headers are not JSON pairs: {e}"),
    })?;
    Ok(Record {
        topic: topic.to_owned(),
        partition: partition_of(partition, "entrega_log")?,
        offset,
        key,
        headers,
        payload,
        timestamp_ms,
    })
}

fn pairs(rows: Vec<(i64, i64)>, table: &'static str) -> Result<Vec<(u32, i64)>, StoreError> {
    rows.into_iter()
        .map(|(p, offset)| Ok((partition_of(p, table)?, offset)))
        .collect()
}

impl DbLog {
    /// The partition count of `topic` (cached once known), or `None` for an unknown topic.
    pub(super) async fn partitions_of(&self, topic: &str) -> Result<Option<u32>, StoreError> {
        if let Some(n) = self.cached(topic) {
            return Ok(Some(n));
        }
        let n: Option<i64> = self
            .db
            .scalar(
                query("SELECT CAST(partitions AS BIGINT) FROM entrega_topics WHERE topic = $1")
                    .bind(topic),
            )
            .await?;
        let n = n.map(|n| partition_of(n, "entrega_topics")).transpose()?;
        if let Some(n) = n {
            self.remember(topic, n);
        }
        Ok(n)
    }

    /// The partition count of `topic`, creating the topic when configured to; else
    /// [`TransportError::UnknownTopic`].
    pub(super) async fn require_topic(&self, topic: &str) -> Result<u32, TransportError> {
        match self.partitions_of(topic).await? {
            Some(n) => Ok(n),
            None => match self.config.auto_create_partitions {
                Some(n) => self.create_topic(topic, n).await,
                None => Err(TransportError::UnknownTopic {
                    topic: topic.to_owned(),
                }),
            },
        }
    }

    /// Creates `topic` with `partitions` partitions unless it exists (then its partition rows
    /// are completed, should any be missing); returns the count it has.
    pub(super) async fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
    ) -> Result<u32, TransportError> {
        let wanted = match i32::try_from(partitions) {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(TransportError::Rejected {
                    reason: format!(
                        "topic `{topic}` needs 1 to {} partitions, not {partitions}",
                        i32::MAX
                    ),
                })
            }
        };
        let mut tx = self.db.begin().await?;
        // A concurrent creator makes this wait for its commit, then do nothing; the count read
        // next is whichever won.
        tx.execute(
            query(
                "INSERT INTO entrega_topics (topic, partitions, created_at_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (topic) DO NOTHING",
            )
            .bind(topic)
            .bind(wanted)
            .bind(self.clock.now_ms()),
        )
        .await?;
        let actual: Option<i64> = tx
            .scalar(
                query("SELECT CAST(partitions AS BIGINT) FROM entrega_topics WHERE topic = $1")
                    .bind(topic),
            )
            .await?;
        let actual = actual.unwrap_or(i64::from(wanted));
        tx.execute(
            query_each(
                "WITH RECURSIVE parts (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM parts
                                              WHERE n + 1 < $2)
                 INSERT INTO entrega_partitions (topic, partition_no) SELECT $1, n FROM parts
                 WHERE true ON CONFLICT (topic, partition_no) DO NOTHING",
                "INSERT INTO entrega_partitions (topic, partition_no)
                 SELECT $1, p FROM generate_series(0, CAST($2 AS INT) - 1) AS p
                 ON CONFLICT (topic, partition_no) DO NOTHING",
            )
            .bind(topic)
            .bind(actual),
        )
        .await?;
        tx.commit().await?;
        let actual = partition_of(actual, "entrega_topics")?;
        self.remember(topic, actual);
        Ok(actual)
    }

    /// The next offset to be written in each partition of `topic` (empty for an unknown topic).
    pub async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, StoreError> {
        let rows = self
            .db
            .fetch_all(
                query(
                    "SELECT CAST(partition_no AS BIGINT), next_offset FROM entrega_partitions
                     WHERE topic = $1 ORDER BY partition_no",
                )
                .bind(topic),
            )
            .await?;
        pairs(rows, "entrega_partitions")
    }

    /// The committed next offset of `group` in each partition of `topic` it has committed.
    pub async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, StoreError> {
        let rows = self
            .db
            .fetch_all(
                query(
                    "SELECT CAST(partition_no AS BIGINT), next_offset FROM entrega_group_offsets
                     WHERE group_id = $1 AND topic = $2 ORDER BY partition_no",
                )
                .bind(group)
                .bind(topic),
            )
            .await?;
        pairs(rows, "entrega_group_offsets")
    }

    /// Members of `group` on `topic` heard from within one lease (`LogConfig::lease_ttl`):
    /// the ones that hold, or may take, its partitions.
    pub async fn members(&self, group: &str, topic: &str) -> Result<u32, StoreError> {
        let ttl = i64::try_from(self.config.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        let since = self.clock.now_ms().saturating_sub(ttl);
        let n: Option<i64> = self
            .db
            .scalar(
                query(
                    "SELECT COUNT(*) FROM entrega_group_members
                     WHERE group_id = $1 AND topic = $2 AND seen_at_ms > $3",
                )
                .bind(group)
                .bind(topic)
                .bind(since),
            )
            .await?;
        Ok(u32::try_from(n.unwrap_or(0)).unwrap_or(u32::MAX))
    }

    /// Up to `max` records of one partition from offset `from` on, in offset order, without
    /// any group.
    pub async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let rows: Vec<RecordRow> = self
            .db
            .fetch_all(
                query(format!(
                    "SELECT {RECORD_COLUMNS} FROM entrega_log
                     WHERE topic = $1 AND partition_no = $2 AND log_offset >= $3
                     ORDER BY log_offset LIMIT $4"
                ))
                .bind(topic)
                .bind(int4(partition))
                .bind(from)
                .bind(i64::try_from(max).unwrap_or(i64::MAX)),
            )
            .await?;
        rows.into_iter().map(|row| record(topic, row)).collect()
    }
}

#[async_trait]
impl TopicAdmin for DbLog {
    async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32, TransportError> {
        if let Some(n) = self.cached(topic) {
            return Ok(n);
        }
        self.create_topic(topic, partitions).await
    }
}

#[async_trait]
impl LogInspector for DbLog {
    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        Ok(DbLog::end_offsets(self, topic).await?)
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        Ok(DbLog::committed(self, group, topic).await?)
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, TransportError> {
        Ok(DbLog::read(self, topic, partition, from, max).await?)
    }

    async fn members(&self, group: &str, topic: &str) -> Result<Option<u32>, TransportError> {
        Ok(Some(DbLog::members(self, group, topic).await?))
    }
}
