//! Parking for ordered retries (`entrega_parked`, inbox migration set): a failing key's
//! records wait here in offset order while the partition's other keys flow.

use std::borrow::Cow;

use async_trait::async_trait;
use entrega_core::{Headers, ParkedAt, ParkedRecord, ParkingStore, StoreError};

use crate::db::{query, Db, Query};
use crate::store::int4;

/// [`ParkingStore`] in the consumer's own database.
#[derive(Debug, Clone)]
pub(crate) struct DbParking {
    db: Db,
}

impl DbParking {
    /// Parking in `db`.
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }
}

/// The columns every query below selects, in [`Row`] order.
const COLUMNS: &str = "group_id, topic, CAST(partition_no AS BIGINT), log_offset, msg_key, \
                       headers, payload, CAST(attempts AS BIGINT), not_before_ms, last_error, \
                       parked_at_ms";

type Row = (
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

fn record(row: Row) -> Result<ParkedRecord, StoreError> {
    let (group, topic, partition, offset, key, headers, payload, attempts, not_before_ms) = (
        row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8,
    );
    let corrupt = |reason: String| StoreError::Corrupt {
        table: "entrega_parked",
        reason,
    };
    Ok(ParkedRecord {
        group,
        topic,
        partition: u32::try_from(partition).map_err(|e| corrupt(format!("partition_no: {e}")))?,
        offset,
        key,
        headers: Headers::from_json(&headers).map_err(|e| corrupt(format!("headers: {e}")))?,
        payload,
        attempts: u32::try_from(attempts).map_err(|e| corrupt(format!("attempts: {e}")))?,
        not_before_ms,
        last_error: row.9,
        parked_at_ms: row.10,
    })
}

/// `sql` with the partition's three columns bound first (`$1`, `$2`, `$3`).
fn at_partition(sql: impl Into<Cow<'static, str>>, at: ParkedAt<'_>) -> Query {
    query(sql)
        .bind(at.group)
        .bind(at.topic)
        .bind(int4(at.partition))
}

#[async_trait]
impl ParkingStore for DbParking {
    async fn park(&self, records: &[ParkedRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut tx = self.db.begin().await?;
        for r in records {
            tx.execute(
                query(
                    "INSERT INTO entrega_parked (group_id, topic, partition_no, log_offset, \
                     msg_key, headers, payload, attempts, not_before_ms, last_error, parked_at_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                     ON CONFLICT DO NOTHING",
                )
                .bind(&r.group)
                .bind(&r.topic)
                .bind(int4(r.partition))
                .bind(r.offset)
                .bind(&r.key)
                .bind(r.headers.to_json())
                .bind(r.payload.as_slice())
                .bind(int4(r.attempts))
                .bind(r.not_before_ms)
                .bind(&r.last_error)
                .bind(r.parked_at_ms),
            )
            .await?;
        }
        tx.commit().await
    }

    async fn parked_keys(&self, at: ParkedAt<'_>) -> Result<Vec<Option<String>>, StoreError> {
        let sql = "SELECT DISTINCT msg_key FROM entrega_parked
                   WHERE group_id = $1 AND topic = $2 AND partition_no = $3";
        let keys: Vec<(Option<String>,)> = self.db.fetch_all(at_partition(sql, at)).await?;
        Ok(keys.into_iter().map(|(key,)| key).collect())
    }

    async fn head(
        &self,
        at: ParkedAt<'_>,
        key: Option<&str>,
    ) -> Result<Option<ParkedRecord>, StoreError> {
        // `msg_key = $4` or `IS NULL` rather than `IS NOT DISTINCT FROM`, which on PostgreSQL
        // cannot use the index.
        let key_test = if key.is_some() {
            "msg_key = $4"
        } else {
            "msg_key IS NULL"
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM entrega_parked
             WHERE group_id = $1 AND topic = $2 AND partition_no = $3 AND {key_test}
             ORDER BY log_offset LIMIT 1"
        );
        let mut statement = at_partition(sql, at);
        if let Some(key) = key {
            statement = statement.bind(key);
        }
        let row: Option<Row> = self.db.fetch_optional(statement).await?;
        row.map(record).transpose()
    }

    async fn reschedule(
        &self,
        at: ParkedAt<'_>,
        offset: i64,
        attempts: u32,
        not_before_ms: i64,
        last_error: &str,
    ) -> Result<(), StoreError> {
        let sql = "UPDATE entrega_parked SET attempts = $5, not_before_ms = $6, last_error = $7
                   WHERE group_id = $1 AND topic = $2 AND partition_no = $3 AND log_offset = $4";
        let statement = at_partition(sql, at)
            .bind(offset)
            .bind(int4(attempts))
            .bind(not_before_ms)
            .bind(last_error);
        self.db.execute(statement).await.map(drop)
    }

    async fn remove(&self, at: ParkedAt<'_>, offset: i64) -> Result<(), StoreError> {
        let sql = "DELETE FROM entrega_parked
                   WHERE group_id = $1 AND topic = $2 AND partition_no = $3 AND log_offset = $4";
        let statement = at_partition(sql, at).bind(offset);
        self.db.execute(statement).await.map(drop)
    }

    async fn list(
        &self,
        group: &str,
        topic: &str,
        limit: usize,
    ) -> Result<Vec<ParkedRecord>, StoreError> {
        let rows: Vec<Row> = self
            .db
            .fetch_all(
                query(format!(
                    "SELECT {COLUMNS} FROM entrega_parked WHERE group_id = $1 AND topic = $2
                     ORDER BY partition_no, log_offset LIMIT $3"
                ))
                .bind(group)
                .bind(topic)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX)),
            )
            .await?;
        rows.into_iter().map(record).collect()
    }
}
