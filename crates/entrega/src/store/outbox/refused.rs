//! Outbox rows the transport refused: recording a refusal under the lane's lease, the counts
//! and first rows operators see, and releasing a held row. (The filter that keeps a blocked
//! aggregate out of the pending reads lives with those reads, in `lanes`.)

use entrega_core::{BlockedRow, LaneLease, Refusal, ReleaseError, StoreError, BLOCKED_ROWS_LISTED};
use uuid::Uuid;

use super::{corrupt, fenced, lease_held_sql};
use crate::db::{query, query_each, Db, TimeMs};
use crate::store::int4;

/// Pending rows the transport refused: the predicate of the partial index `outbox_blocked`.
const REFUSED: &str =
    "publicado_en IS NULL AND (next_attempt_at IS NOT NULL OR held_at IS NOT NULL)";

/// Counts the refusal of one row: its attempts, last error, and either the time of its next
/// attempt or, when it is held, the time it was held. The lease check and the update are one
/// statement, as in marking.
pub(super) async fn record(
    db: &Db,
    lease: &LaneLease,
    refusal: &Refusal,
    now_ms: i64,
) -> Result<(), StoreError> {
    let statement = query(concat!(
        "UPDATE outbox \
         SET attempts = attempts + 1, last_error = $1, next_attempt_at = $2, held_at = $3 \
         WHERE id = $4 AND lane = $5 AND publicado_en IS NULL AND ",
        lease_held_sql!("$5", "$6", "$7")
    ))
    .bind(&refusal.error)
    .bind(refusal.retry_at_ms.map(TimeMs))
    .bind(refusal.holds().then_some(TimeMs(now_ms)))
    .bind(refusal.id)
    .bind(int4(lease.lane))
    .bind(&lease.owner)
    .bind(lease.token);
    fenced(db, statement, lease).await
}

/// `id, agregado, agregado_id, tipo, attempts, last_error, next_attempt_at, held_at`.
type BlockedColumns = (
    String,
    String,
    String,
    String,
    i64,
    Option<String>,
    Option<TimeMs>,
    Option<TimeMs>,
);

/// Counts of refused pending rows (retrying, held) and the first of them by insertion.
pub(super) async fn listed(db: &Db) -> Result<(u64, u64, Vec<BlockedRow>), StoreError> {
    let counts: Option<(i64, i64)> = db
        .fetch_optional(query(format!(
            "SELECT COUNT(CASE WHEN held_at IS NULL THEN 1 END),
                    COUNT(CASE WHEN held_at IS NOT NULL THEN 1 END)
             FROM outbox WHERE {REFUSED}"
        )))
        .await?;
    let (retrying, held) = counts.unwrap_or((0, 0));
    let rows: Vec<BlockedColumns> = db
        .fetch_all(
            query_each(
                format!(
                    "SELECT id, agregado, agregado_id, tipo, CAST(attempts AS BIGINT),
                            last_error, next_attempt_at, held_at
                     FROM outbox WHERE {REFUSED} ORDER BY rowid LIMIT $1"
                ),
                format!(
                    "SELECT CAST(id AS TEXT), agregado, agregado_id, tipo,
                            CAST(attempts AS BIGINT), last_error, next_attempt_at, held_at
                     FROM outbox WHERE {REFUSED} ORDER BY seq LIMIT $1"
                ),
            )
            .bind(i64::try_from(BLOCKED_ROWS_LISTED).unwrap_or(i64::MAX)),
        )
        .await?;
    let listed = rows
        .into_iter()
        .map(|row| {
            let id =
                Uuid::parse_str(&row.0).map_err(|e| corrupt(format!("id `{}`: {e}", row.0)))?;
            Ok(BlockedRow {
                id,
                aggregate: row.1,
                aggregate_id: row.2,
                kind: row.3,
                attempts: u32::try_from(row.4).unwrap_or(0),
                next_attempt_ms: row.6.map(|t| t.0),
                last_error: row.5,
                held_at_ms: row.7.map(|t| t.0),
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok((
        u64::try_from(retrying).unwrap_or(0),
        u64::try_from(held).unwrap_or(0),
        listed,
    ))
}

/// Puts a held row back in line: its next publishing attempt comes with its lane's next
/// round.
pub(super) async fn release(db: &Db, id: Uuid) -> Result<(), ReleaseError> {
    // The row stays locked from the check to the update (SQLite's write transaction locks
    // the whole database from its start).
    let mut tx = db.begin().await?;
    let found: Option<(bool,)> = tx
        .fetch_optional(
            query_each(
                "SELECT publicado_en IS NULL AND held_at IS NOT NULL FROM outbox WHERE id = $1",
                "SELECT publicado_en IS NULL AND held_at IS NOT NULL FROM outbox WHERE id = $1
                 FOR UPDATE",
            )
            .bind(id),
        )
        .await?;
    match found {
        None => return Err(ReleaseError::UnknownRow { id }),
        Some((false,)) => return Err(ReleaseError::NotHeld { id }),
        Some((true,)) => {}
    }
    tx.execute(
        query("UPDATE outbox SET held_at = NULL, next_attempt_at = NULL WHERE id = $1").bind(id),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
