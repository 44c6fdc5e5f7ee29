//! Outbox rows the transport refused, on PostgreSQL: recording a refusal under the lane's
//! lease, the operators' list and releasing a held row. The filter that keeps a blocked
//! aggregate out of the pending reads lives with those reads (`outbox_lanes`).

use entrega_core::{BlockedRow, LaneLease, Refusal, ReleaseError, StoreError, BLOCKED_ROWS_LISTED};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;
use uuid::Uuid;

use crate::errors::{classify, invalid};
use crate::outbox::timestamp_ms;

/// Pending rows the transport refused; the predicate of the partial index `outbox_blocked`.
const REFUSED: &str =
    "publicado_en IS NULL AND (proximo_intento IS NOT NULL OR aparcado_en IS NOT NULL)";

/// Whether `lease` is still held as it was handed out.
pub(crate) async fn lease_held(pool: &PgPool, lease: &LaneLease) -> Result<bool, StoreError> {
    let lane = i32::try_from(lease.lane).map_err(|_| invalid("lane out of range"))?;
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM entrega_relay_lanes
                        WHERE lane = $1 AND owner = $2 AND token = $3)",
    )
    .bind(lane)
    .bind(&lease.owner)
    .bind(lease.token)
    .fetch_one(pool)
    .await
    .map_err(classify)
}

pub(crate) async fn record_refusal(
    pool: &PgPool,
    lease: &LaneLease,
    refusal: &Refusal,
    now_ms: i64,
) -> Result<(), StoreError> {
    let lane = i32::try_from(lease.lane).map_err(|_| invalid("lane out of range"))?;
    // The fence and the update are one statement, as in `mark_published`.
    let done = sqlx::query(
        "UPDATE outbox
         SET intentos = intentos + 1,
             ultimo_error = $1,
             proximo_intento = to_timestamp($2::float8 / 1000.0),
             aparcado_en = CASE WHEN $2::int8 IS NULL THEN to_timestamp($3::float8 / 1000.0) END
         WHERE id = $4 AND lane = $5 AND publicado_en IS NULL
           AND EXISTS (SELECT 1 FROM entrega_relay_lanes
                       WHERE lane = $5 AND owner = $6 AND token = $7)",
    )
    .bind(&refusal.error)
    .bind(refusal.retry_at_ms.map(timestamp_ms))
    .bind(timestamp_ms(now_ms))
    .bind(refusal.id)
    .bind(lane)
    .bind(&lease.owner)
    .bind(lease.token)
    .execute(pool)
    .await
    .map_err(classify)?;
    // Nothing matched: the lease is gone, or the row is (published or purged meanwhile).
    if done.rows_affected() > 0 || lease_held(pool, lease).await? {
        Ok(())
    } else {
        Err(StoreError::LeaseLost {
            what: format!("relay lane {}", lease.lane),
        })
    }
}

/// Counts of refused pending rows (retrying, held) and the first of them by insertion.
pub(crate) async fn refused(pool: &PgPool) -> Result<(u64, u64, Vec<BlockedRow>), StoreError> {
    let (retrying, held): (i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*) FILTER (WHERE aparcado_en IS NULL),
                count(*) FILTER (WHERE aparcado_en IS NOT NULL)
         FROM outbox WHERE {REFUSED}"
    ))
    .fetch_one(pool)
    .await
    .map_err(classify)?;
    let rows = sqlx::query(&format!(
        "SELECT id, agregado, agregado_id, tipo, intentos, ultimo_error,
                (extract(epoch FROM proximo_intento) * 1000)::bigint AS next_ms,
                (extract(epoch FROM aparcado_en) * 1000)::bigint AS held_ms
         FROM outbox WHERE {REFUSED}
         ORDER BY seq LIMIT $1"
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

fn blocked_row(row: &PgRow) -> Result<BlockedRow, StoreError> {
    let attempts: i32 = row.try_get("intentos").map_err(classify)?;
    Ok(BlockedRow {
        id: row.try_get("id").map_err(classify)?,
        aggregate: row.try_get("agregado").map_err(classify)?,
        aggregate_id: row.try_get("agregado_id").map_err(classify)?,
        kind: row.try_get("tipo").map_err(classify)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        next_attempt_ms: row.try_get("next_ms").map_err(classify)?,
        last_error: row.try_get("ultimo_error").map_err(classify)?,
        held_at_ms: row.try_get("held_ms").map_err(classify)?,
    })
}

pub(crate) async fn release(pool: &PgPool, id: Uuid) -> Result<(), ReleaseError> {
    // One statement decides and writes: the row's state before the update tells why
    // nothing changed, when nothing did.
    let found: Option<(bool,)> = sqlx::query_as(
        "WITH target AS (
             SELECT id, publicado_en IS NULL AND aparcado_en IS NOT NULL AS held
             FROM outbox WHERE id = $1 FOR UPDATE
         ), released AS (
             UPDATE outbox o SET aparcado_en = NULL, proximo_intento = NULL
             FROM target t WHERE o.id = t.id AND t.held
             RETURNING 1
         )
         SELECT held FROM target",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    match found {
        None => Err(ReleaseError::UnknownRow { id }),
        Some((false,)) => Err(ReleaseError::NotHeld { id }),
        Some((true,)) => Ok(()),
    }
}
