//! Releasing a held outbox row, audited: the release and the audit entry naming the operator
//! commit in one transaction of the outbox's database, so no release goes unrecorded.

use entrega_core::{now_ms, DlqAction, ReleaseError};
use uuid::Uuid;

use crate::db::{query, query_each, Db};

/// Releases outbox row `id` from holding (the relay tries it again at once) and records it
/// in `entrega_dlq_audit` under `operator`, in one transaction. The database needs the outbox
/// and dead-letter migration sets. An unknown row, or one not held, changes nothing and is
/// not recorded.
pub async fn release_outbox_row(db: &Db, id: Uuid, operator: &str) -> Result<(), ReleaseError> {
    let mut tx = db.begin().await?;
    let held: Option<(bool,)> = tx
        .fetch_optional(
            query_each(
                "SELECT publicado_en IS NULL AND held_at IS NOT NULL FROM outbox
                 WHERE id = $1",
                "SELECT publicado_en IS NULL AND held_at IS NOT NULL FROM outbox
                 WHERE id = CAST($1 AS UUID) FOR UPDATE",
            )
            .bind(id.hyphenated().to_string()),
        )
        .await?;
    match held {
        None => return Err(ReleaseError::UnknownRow { id }),
        Some((false,)) => return Err(ReleaseError::NotHeld { id }),
        Some((true,)) => {}
    }
    tx.execute(
        query_each(
            "UPDATE outbox SET held_at = NULL, next_attempt_at = NULL WHERE id = $1",
            "UPDATE outbox SET held_at = NULL, next_attempt_at = NULL
             WHERE id = CAST($1 AS UUID)",
        )
        .bind(id.hyphenated().to_string()),
    )
    .await?;
    tx.execute(
        query(
            "INSERT INTO entrega_dlq_audit (at_ms, operator, action, filter, dry_run, matched,
                 applied, refused, detail)
             VALUES ($1, $2, $3, $4, $5, 1, 1, 0, NULL)",
        )
        .bind(now_ms())
        .bind(operator)
        .bind(DlqAction::OutboxRelease.as_str())
        .bind(format!("--id {id}"))
        .bind(false),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
