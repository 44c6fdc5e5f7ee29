//! Outbox rows the transport refused, on SQLite: the filter that keeps a blocked aggregate out
//! of the pending reads, recording a refusal under the lane's lease, the operators' list and
//! releasing a held row.

use entrega_core::{BlockedRow, LaneLease, Refusal, ReleaseError, StoreError, BLOCKED_ROWS_LISTED};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection, SqlitePool};
use uuid::Uuid;

use crate::connect::begin_immediate;
use crate::errors::{classify, corrupt};
use crate::timefmt::{epoch_ms_sql, format_ms};

/// Condition on a pending row `o`: no row of its aggregate at or before it is blocked. Binds,
/// in order: the lane, then the current time as text. The first probe does not depend on the
/// row, so SQLite runs it once per statement; while the lane has no refused rows (the usual
/// case) the second, per row, is never asked. Both read the partial index `outbox_blocked`.
pub(crate) const UNBLOCKED: &str = "
    (NOT EXISTS (SELECT 1 FROM outbox b
                 WHERE b.lane = ? AND b.publicado_en IS NULL
                   AND (b.proximo_intento IS NOT NULL OR b.aparcado_en IS NOT NULL))
     OR NOT EXISTS (SELECT 1 FROM outbox b
                    WHERE b.lane = o.lane AND b.agregado_id = o.agregado_id
                      AND b.rowid <= o.rowid AND b.publicado_en IS NULL
                      AND (b.proximo_intento IS NOT NULL OR b.aparcado_en IS NOT NULL)
                      AND (b.aparcado_en IS NOT NULL OR b.proximo_intento > ?)))";

/// Fails with [`StoreError::LeaseLost`] unless `lease` is still held as it was handed out;
/// run inside the write transaction that relies on it.
pub(crate) async fn ensure_held(
    conn: &mut SqliteConnection,
    lease: &LaneLease,
) -> Result<(), StoreError> {
    let held: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM entrega_relay_lanes WHERE lane = ? AND owner = ? AND token = ?",
    )
    .bind(i64::from(lease.lane))
    .bind(&lease.owner)
    .bind(lease.token)
    .fetch_optional(conn)
    .await
    .map_err(classify)?;
    match held {
        Some(_) => Ok(()),
        None => Err(StoreError::LeaseLost {
            what: format!("relay lane {}", lease.lane),
        }),
    }
}

pub(crate) async fn record_refusal(
    pool: &SqlitePool,
    lease: &LaneLease,
    refusal: &Refusal,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mut tx = begin_immediate(pool).await?;
    // The fence and the update share one write transaction, as in `mark_published`.
    ensure_held(&mut tx, lease).await?;
    sqlx::query(
        "UPDATE outbox
         SET intentos = intentos + 1, ultimo_error = ?, proximo_intento = ?, aparcado_en = ?
         WHERE id = ? AND lane = ? AND publicado_en IS NULL",
    )
    .bind(&refusal.error)
    .bind(refusal.retry_at_ms.map(format_ms))
    .bind(refusal.holds().then(|| format_ms(now_ms)))
    .bind(refusal.id.hyphenated().to_string())
    .bind(i64::from(lease.lane))
    .execute(&mut *tx)
    .await
    .map_err(classify)?;
    tx.commit().await.map_err(classify)
}

/// Counts of refused pending rows (retrying, held) and the first of them by insertion.
pub(crate) async fn refused(pool: &SqlitePool) -> Result<(u64, u64, Vec<BlockedRow>), StoreError> {
    const REFUSED: &str = "publicado_en IS NULL
                           AND (proximo_intento IS NOT NULL OR aparcado_en IS NOT NULL)";
    let (retrying, held): (i64, i64) = sqlx::query_as(&format!(
        "SELECT COALESCE(SUM(aparcado_en IS NULL), 0), COALESCE(SUM(aparcado_en IS NOT NULL), 0)
         FROM outbox WHERE {REFUSED}"
    ))
    .fetch_one(pool)
    .await
    .map_err(classify)?;
    let rows = sqlx::query(&format!(
        "SELECT id, agregado, agregado_id, tipo, intentos, ultimo_error,
                {} AS next_ms, {} AS held_ms
         FROM outbox WHERE {REFUSED}
         ORDER BY rowid LIMIT ?",
        epoch_ms_sql("proximo_intento"),
        epoch_ms_sql("aparcado_en"),
    ))
    .bind(i64::try_from(BLOCKED_ROWS_LISTED).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await
    .map_err(classify)?;
    let listed = rows.iter().map(blocked_row).collect::<Result<_, _>>()?;
    Ok((
        u64::try_from(retrying).unwrap_or(0),
        u64::try_from(held).unwrap_or(0),
        listed,
    ))
}

fn blocked_row(row: &SqliteRow) -> Result<BlockedRow, StoreError> {
    let get_err = |e: sqlx::Error| corrupt("outbox", e);
    let id: String = row.try_get("id").map_err(get_err)?;
    let id = Uuid::parse_str(&id).map_err(|e| corrupt("outbox", format!("id `{id}`: {e}")))?;
    let attempts: i64 = row.try_get("intentos").map_err(get_err)?;
    Ok(BlockedRow {
        id,
        aggregate: row.try_get("agregado").map_err(get_err)?,
        aggregate_id: row.try_get("agregado_id").map_err(get_err)?,
        kind: row.try_get("tipo").map_err(get_err)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        next_attempt_ms: row.try_get("next_ms").map_err(get_err)?,
        last_error: row.try_get("ultimo_error").map_err(get_err)?,
        held_at_ms: row.try_get("held_ms").map_err(get_err)?,
    })
}

pub(crate) async fn release(pool: &SqlitePool, id: Uuid) -> Result<(), ReleaseError> {
    let mut tx = begin_immediate(pool).await?;
    let found: Option<(bool,)> = sqlx::query_as(
        "SELECT publicado_en IS NULL AND aparcado_en IS NOT NULL FROM outbox WHERE id = ?",
    )
    .bind(id.hyphenated().to_string())
    .fetch_optional(&mut *tx)
    .await
    .map_err(classify)?;
    match found {
        None => return Err(ReleaseError::UnknownRow { id }),
        Some((false,)) => return Err(ReleaseError::NotHeld { id }),
        Some((true,)) => {}
    }
    sqlx::query("UPDATE outbox SET aparcado_en = NULL, proximo_intento = NULL WHERE id = ?")
        .bind(id.hyphenated().to_string())
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    Ok(())
}
