//! The idempotent consumer's key table (`mensajes_procesados`) on SQLite.

use std::time::Duration;

use entrega_core::{now_ms, StoreError};
use sqlx::{SqliteConnection, SqlitePool};

use crate::errors::classify;
use crate::timefmt::format_ms;

/// Idempotent consumption: the message key is recorded in the same transaction as the effect,
/// so both commit together or neither does.
///
/// ```no_run
/// # use entrega_sqlite::SqliteInbox;
/// # async fn consume(pool: sqlx::SqlitePool, id: &str) -> Result<(), entrega_core::StoreError> {
/// let mut tx = entrega_sqlite::begin_immediate(&pool).await?;
/// if SqliteInbox::claim(&mut tx, "inventario.descuento_stock", id).await? {
///     // apply the effect on `&mut *tx`
/// }
/// tx.commit().await.map_err(entrega_sqlite::classify)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SqliteInbox;

impl SqliteInbox {
    /// Records `(message_id, consumer)` in the caller's transaction. `Ok(true)`: the key is
    /// new, apply the effect in the same transaction. `Ok(false)`: a duplicate, do nothing.
    pub async fn claim(
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, StoreError> {
        let inserted: Option<i64> = sqlx::query_scalar(
            "INSERT INTO mensajes_procesados (id_mensaje, consumidor) VALUES (?, ?)
             ON CONFLICT DO NOTHING
             RETURNING 1",
        )
        .bind(message_id)
        .bind(consumer)
        .fetch_optional(conn)
        .await
        .map_err(classify)?;
        Ok(inserted.is_some())
    }

    /// Records every key of `message_ids` for `consumer` in one statement of the caller's
    /// transaction, and returns those that were new: the set-based form of [`claim`](Self::claim)
    /// for a whole batch. A key repeated in `message_ids` is claimed once.
    pub async fn claim_all(
        conn: &mut SqliteConnection,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        if message_ids.is_empty() {
            return Ok(std::collections::HashSet::new());
        }
        // One JSON array parameter, whatever the batch size (no limit on parameters).
        let keys = keys_json(message_ids)?;
        // `WHERE true` tells SQLite's parser the `ON CONFLICT` belongs to the insert.
        let claimed: Vec<String> = sqlx::query_scalar(
            "INSERT INTO mensajes_procesados (id_mensaje, consumidor)
             SELECT DISTINCT k.value, ? FROM json_each(?) AS k WHERE true
             ON CONFLICT DO NOTHING
             RETURNING id_mensaje",
        )
        .bind(consumer)
        .bind(keys)
        .fetch_all(conn)
        .await
        .map_err(classify)?;
        Ok(claimed.into_iter().collect())
    }

    /// Removes the keys `message_ids` of `consumer` in the caller's transaction; returns how
    /// many: gives back the keys [`claim_all`](Self::claim_all) took for messages the batch
    /// then refused, so they commit unrecorded as if never claimed.
    pub async fn unclaim_all(
        conn: &mut SqliteConnection,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<u64, StoreError> {
        if message_ids.is_empty() {
            return Ok(0);
        }
        let keys = keys_json(message_ids)?;
        let done = sqlx::query(
            "DELETE FROM mensajes_procesados
             WHERE consumidor = ? AND id_mensaje IN (SELECT value FROM json_each(?))",
        )
        .bind(consumer)
        .bind(keys)
        .execute(conn)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    /// Deletes keys recorded more than `age` ago (by `procesado_en`); returns how many.
    /// A message redelivered after its key was purged would be applied again, so `age` must
    /// exceed the longest redelivery window of the transport.
    pub async fn purge_older_than(pool: &SqlitePool, age: Duration) -> Result<u64, StoreError> {
        let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        // Same text format as the column default, so the comparison (and its index) is exact.
        let cutoff = format_ms(now_ms().saturating_sub(age_ms));
        let done = sqlx::query("DELETE FROM mensajes_procesados WHERE procesado_en < ?")
            .bind(cutoff)
            .execute(pool)
            .await
            .map_err(classify)?;
        Ok(done.rows_affected())
    }

    /// Number of keys recorded for `consumer`.
    pub async fn count(pool: &SqlitePool, consumer: &str) -> Result<u64, StoreError> {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM mensajes_procesados WHERE consumidor = ?")
                .bind(consumer)
                .fetch_one(pool)
                .await
                .map_err(classify)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// Keys as one JSON array parameter, read back with `json_each` (no limit on parameters).
fn keys_json(message_ids: &[&str]) -> Result<String, StoreError> {
    serde_json::to_string(message_ids).map_err(|e| StoreError::Corrupt {
        table: "mensajes_procesados",
        reason: format!("keys not encodable: {e}"),
    })
}
