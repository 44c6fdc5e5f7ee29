//! Topics, and reading the log directly: creation, end offsets, committed offsets, records.

use async_trait::async_trait;
use entrega_core::{Headers, Record, StoreError, TopicAdmin, TransportError};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::SqliteLog;
use crate::connect::begin_immediate;
use crate::errors::{classify, corrupt, transport};

/// Creates `topic` with `partitions` partitions unless it exists, on the caller's write
/// transaction; returns the topic's actual partition count.
pub(super) async fn create_topic_in(
    conn: &mut SqliteConnection,
    topic: &str,
    partitions: u32,
    now_ms: i64,
) -> Result<u32, TransportError> {
    if partitions == 0 {
        return Err(TransportError::Rejected {
            reason: format!("topic `{topic}` needs at least one partition"),
        });
    }
    sqlx::query(
        "INSERT INTO entrega_topics (topic, partitions, created_at_ms) VALUES (?, ?, ?)
         ON CONFLICT (topic) DO NOTHING",
    )
    .bind(topic)
    .bind(i64::from(partitions))
    .bind(now_ms)
    .execute(&mut *conn)
    .await
    .map_err(transport)?;
    let actual: i64 = sqlx::query_scalar("SELECT partitions FROM entrega_topics WHERE topic = ?")
        .bind(topic)
        .fetch_one(&mut *conn)
        .await
        .map_err(transport)?;
    // Idempotent, so a topic whose partition rows were lost is repaired too.
    sqlx::query(
        "WITH RECURSIVE parts (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM parts WHERE n + 1 < ?)
         INSERT INTO entrega_partitions (topic, partition_no) SELECT ?, n FROM parts WHERE true
         ON CONFLICT (topic, partition_no) DO NOTHING",
    )
    .bind(actual)
    .bind(topic)
    .execute(&mut *conn)
    .await
    .map_err(transport)?;
    u32::try_from(actual).map_err(|_| {
        corrupt(
            "entrega_topics",
            format!("`{topic}` has {actual} partitions"),
        )
        .into()
    })
}

fn decode_record(topic: &str, row: &SqliteRow) -> Result<Record, StoreError> {
    let get_err = |e: sqlx::Error| corrupt("entrega_log", e);
    let partition: i64 = row.try_get("partition_no").map_err(get_err)?;
    let offset: i64 = row.try_get("log_offset").map_err(get_err)?;
    let headers: String = row.try_get("headers").map_err(get_err)?;
    let headers = Headers::from_json(&headers).map_err(|e| {
        corrupt(
            "entrega_log",
            format!("`{topic}` {partition}@{offset}: headers: {e}"),
        )
    })?;
    Ok(Record {
        topic: topic.to_owned(),
        partition: u32::try_from(partition)
            .map_err(|_| corrupt("entrega_log", format!("partition {partition}")))?,
        offset,
        key: row.try_get("msg_key").map_err(get_err)?,
        headers,
        payload: row.try_get("payload").map_err(get_err)?,
        timestamp_ms: row.try_get("appended_at_ms").map_err(get_err)?,
    })
}

fn pairs(rows: Vec<(i64, i64)>, table: &'static str) -> Result<Vec<(u32, i64)>, StoreError> {
    rows.into_iter()
        .map(|(p, offset)| {
            u32::try_from(p)
                .map(|p| (p, offset))
                .map_err(|_| corrupt(table, format!("partition {p}")))
        })
        .collect()
}

impl SqliteLog {
    /// Partition count of `topic`, or `None` if it does not exist.
    pub(super) async fn topic_partitions(&self, topic: &str) -> Result<Option<u32>, StoreError> {
        let n: Option<i64> =
            sqlx::query_scalar("SELECT partitions FROM entrega_topics WHERE topic = ?")
                .bind(topic)
                .fetch_optional(&self.pool)
                .await
                .map_err(classify)?;
        n.map(|n| {
            u32::try_from(n).map_err(|_| corrupt("entrega_topics", format!("{n} partitions")))
        })
        .transpose()
    }

    /// Creates `topic` unless it exists; returns its partition count.
    pub(super) async fn create_topic(
        &self,
        topic: &str,
        partitions: u32,
    ) -> Result<u32, TransportError> {
        let mut tx = begin_immediate(&self.pool).await?;
        let actual = create_topic_in(&mut tx, topic, partitions, self.clock.now_ms()).await?;
        tx.commit().await.map_err(transport)?;
        Ok(actual)
    }

    /// The next offset to be written in each partition of `topic` (empty if the topic does
    /// not exist). With [`SqliteLog::committed`] this gives a group's lag.
    pub async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, StoreError> {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT partition_no, next_offset FROM entrega_partitions
             WHERE topic = ? ORDER BY partition_no",
        )
        .bind(topic)
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        pairs(rows, "entrega_partitions")
    }

    /// The committed next offset of `group` in each partition of `topic` it has committed.
    pub async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, StoreError> {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT partition_no, next_offset FROM entrega_group_offsets
             WHERE group_id = ? AND topic = ? ORDER BY partition_no",
        )
        .bind(group)
        .bind(topic)
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        pairs(rows, "entrega_group_offsets")
    }

    /// Up to `max` records of one partition from offset `from` on, in offset order, without
    /// any group (tests and tooling).
    pub async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let rows = sqlx::query(
            "SELECT partition_no, log_offset, msg_key, headers, payload, appended_at_ms
             FROM entrega_log
             WHERE topic = ? AND partition_no = ? AND log_offset >= ?
             ORDER BY log_offset
             LIMIT ?",
        )
        .bind(topic)
        .bind(i64::from(partition))
        .bind(from)
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        rows.iter().map(|row| decode_record(topic, row)).collect()
    }
}

#[async_trait]
impl TopicAdmin for SqliteLog {
    async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32, TransportError> {
        self.create_topic(topic, partitions).await
    }
}
