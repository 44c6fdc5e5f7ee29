//! Operator state and audit of dead letters (`entrega_dlq_state`, `entrega_dlq_audit`, dlq
//! migration set), for the dead-letter tooling.

use async_trait::async_trait;
use entrega_core::{
    DeadLetterId, DeadLetterMark, DeadLetterState, DlqAction, DlqAuditEntry, DlqStore, StoreError,
};

use crate::db::{query, Db};

/// [`DlqStore`] in a database with the dlq migration set.
#[derive(Debug, Clone)]
pub(crate) struct DbDeadLetterMarks {
    db: Db,
}

impl DbDeadLetterMarks {
    /// The marks and audit in `db`.
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }
}

/// `dlq_topic, partition_no, log_offset, state, changed_at_ms, operator, reason, replays`.
type MarkRow = (String, i64, i64, String, i64, String, Option<String>, i64);

/// `at_ms, operator, action, filter, dry_run, matched, applied, refused, detail`.
type AuditRow = (
    i64,
    String,
    String,
    String,
    bool,
    i64,
    i64,
    i64,
    Option<String>,
);

fn mark(row: MarkRow) -> Result<DeadLetterMark, StoreError> {
    let (topic, partition, offset, state, at_ms, operator, reason, replays) = row;
    let corrupt = |reason: String| StoreError::Corrupt {
        table: "entrega_dlq_state",
        reason,
    };
    Ok(DeadLetterMark {
        id: DeadLetterId {
            topic,
            partition: u32::try_from(partition)
                .map_err(|_| corrupt(format!("partition {partition}")))?,
            offset,
        },
        state: DeadLetterState::parse(&state).ok_or_else(|| corrupt(format!("state `{state}`")))?,
        at_ms,
        operator,
        reason,
        replays: u32::try_from(replays).map_err(|_| corrupt(format!("replays {replays}")))?,
    })
}

fn audit_entry(row: AuditRow) -> Result<DlqAuditEntry, StoreError> {
    let (at_ms, operator, action, filter, dry_run, matched, applied, refused, detail) = row;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(DlqAuditEntry {
        at_ms,
        operator,
        action: DlqAction::parse(&action).ok_or_else(|| StoreError::Corrupt {
            table: "entrega_dlq_audit",
            reason: format!("action `{action}`"),
        })?,
        filter,
        dry_run,
        matched: count(matched),
        applied: count(applied),
        refused: count(refused),
        detail,
    })
}

/// A count as a database integer (saturating: no count comes near it).
fn db_count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl DlqStore for DbDeadLetterMarks {
    async fn marks(&self, dlq_topic: &str) -> Result<Vec<DeadLetterMark>, StoreError> {
        let rows: Vec<MarkRow> = self
            .db
            .fetch_all(
                query(
                    "SELECT dlq_topic, CAST(partition_no AS BIGINT), log_offset, state,
                            changed_at_ms, operator, reason, CAST(replays AS BIGINT)
                     FROM entrega_dlq_state WHERE dlq_topic = $1
                     ORDER BY partition_no, log_offset",
                )
                .bind(dlq_topic),
            )
            .await?;
        rows.into_iter().map(mark).collect()
    }

    async fn record(
        &self,
        entry: &DlqAuditEntry,
        marks: &[DeadLetterMark],
    ) -> Result<(), StoreError> {
        let mut tx = self.db.begin().await?;
        for mark in marks {
            tx.execute(
                query(
                    "INSERT INTO entrega_dlq_state (dlq_topic, partition_no, log_offset, state,
                         changed_at_ms, operator, reason, replays)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
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
                .bind(i64::from(mark.replays)),
            )
            .await?;
        }
        tx.execute(
            query(
                "INSERT INTO entrega_dlq_audit (at_ms, operator, action, filter, dry_run, matched,
                     applied, refused, detail)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(entry.at_ms)
            .bind(&entry.operator)
            .bind(entry.action.as_str())
            .bind(&entry.filter)
            .bind(entry.dry_run)
            .bind(db_count(entry.matched))
            .bind(db_count(entry.applied))
            .bind(db_count(entry.refused))
            .bind(&entry.detail),
        )
        .await?;
        tx.commit().await
    }

    async fn lock_actions(
        &self,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let taken = self
            .db
            .execute(
                query(
                    "INSERT INTO entrega_dlq_actions (scope, holder, expires_at_ms)
                     VALUES ('actions', $1, $2)
                     ON CONFLICT (scope) DO UPDATE SET
                         holder = excluded.holder, expires_at_ms = excluded.expires_at_ms
                     WHERE entrega_dlq_actions.holder = excluded.holder
                        OR entrega_dlq_actions.expires_at_ms < $3",
                )
                .bind(holder)
                .bind(expires_at_ms)
                .bind(now_ms),
            )
            .await?;
        Ok(taken == 1)
    }

    async fn unlock_actions(&self, holder: &str) -> Result<(), StoreError> {
        self.db
            .execute(query("DELETE FROM entrega_dlq_actions WHERE holder = $1").bind(holder))
            .await?;
        Ok(())
    }

    async fn audit(&self, limit: usize) -> Result<Vec<DlqAuditEntry>, StoreError> {
        let rows: Vec<AuditRow> = self
            .db
            .fetch_all(
                query(
                    "SELECT at_ms, operator, action, filter, dry_run, matched, applied, refused,
                            detail
                     FROM entrega_dlq_audit ORDER BY id DESC LIMIT $1",
                )
                .bind(i64::try_from(limit).unwrap_or(i64::MAX)),
            )
            .await?;
        rows.into_iter().map(audit_entry).collect()
    }
}
