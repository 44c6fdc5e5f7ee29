//! Operator state and audit of dead letters (`entrega_dlq_state`, `entrega_dlq_audit`) on
//! SQLite, for `entrega`'s dead-letter tooling.

use async_trait::async_trait;
use entrega_core::{
    db_count, AuditRow, DeadLetterMark, DlqAuditEntry, DlqStore, MarkRow, StoreError,
};
use sqlx::SqlitePool;

use crate::connect::begin_immediate;
use crate::errors::classify;

/// [`DlqStore`] in an SQLite database migrated with [`entrega_core::MigrationSet::Dlq`].
#[derive(Debug, Clone)]
pub struct SqliteDlqStore {
    pool: SqlitePool,
}

impl SqliteDlqStore {
    /// The store in `pool`'s database.
    pub fn new(pool: SqlitePool) -> Self {
        Self { pool }
    }
}

#[async_trait]
impl DlqStore for SqliteDlqStore {
    async fn marks(&self, dlq_topic: &str) -> Result<Vec<DeadLetterMark>, StoreError> {
        let rows: Vec<MarkRow> = sqlx::query_as(
            "SELECT dlq_topic, partition_no, log_offset, state, changed_at_ms, operator, reason,
                    replays
             FROM entrega_dlq_state WHERE dlq_topic = ?
             ORDER BY partition_no, log_offset",
        )
        .bind(dlq_topic)
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        rows.into_iter()
            .map(|r| DeadLetterMark::from_stored(r.into()))
            .collect()
    }

    async fn record(
        &self,
        entry: &DlqAuditEntry,
        marks: &[DeadLetterMark],
    ) -> Result<(), StoreError> {
        let mut tx = begin_immediate(&self.pool).await?;
        for mark in marks {
            sqlx::query(
                "INSERT INTO entrega_dlq_state (dlq_topic, partition_no, log_offset, state,
                     changed_at_ms, operator, reason, replays)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (dlq_topic, partition_no, log_offset) DO UPDATE SET
                     state = excluded.state, changed_at_ms = excluded.changed_at_ms,
                     operator = excluded.operator, reason = excluded.reason,
                     replays = excluded.replays",
            )
            .bind(&mark.id.topic)
            .bind(i64::from(mark.id.partition))
            .bind(mark.id.offset)
            .bind(mark.state.as_str())
            .bind(mark.at_ms)
            .bind(&mark.operator)
            .bind(&mark.reason)
            .bind(i64::from(mark.replays))
            .execute(&mut *tx)
            .await
            .map_err(classify)?;
        }
        sqlx::query(
            "INSERT INTO entrega_dlq_audit (at_ms, operator, action, filter, dry_run, matched,
                 applied, refused, detail)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(entry.at_ms)
        .bind(&entry.operator)
        .bind(entry.action.as_str())
        .bind(&entry.filter)
        .bind(entry.dry_run)
        .bind(db_count(entry.matched))
        .bind(db_count(entry.applied))
        .bind(db_count(entry.refused))
        .bind(&entry.detail)
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        tx.commit().await.map_err(classify)
    }

    async fn audit(&self, limit: usize) -> Result<Vec<DlqAuditEntry>, StoreError> {
        let rows: Vec<AuditRow> = sqlx::query_as(
            "SELECT at_ms, operator, action, filter, dry_run, matched, applied, refused, detail
             FROM entrega_dlq_audit ORDER BY id DESC LIMIT ?",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(classify)?;
        rows.into_iter()
            .map(|r| DlqAuditEntry::from_stored(r.into()))
            .collect()
    }
}
