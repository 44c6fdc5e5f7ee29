//! The idempotent consumer: the message key is recorded in the effect's own transaction.

use std::time::Duration;

use entrega_core::StoreError;
use sqlx::postgres::{PgConnection, PgPool};

use crate::errors::classify;

/// Idempotency keys in `mensajes_procesados` (the seed's table).
///
/// ```no_run
/// # use entrega_postgres::{classify, PgInbox, PgPool};
/// # async fn consume(pool: PgPool, id: &str) -> Result<(), entrega_core::StoreError> {
/// let mut tx = pool.begin().await.map_err(classify)?;
/// if PgInbox::claim(&mut tx, "inventario.descuento_stock", id).await? {
///     // apply the effect with `&mut *tx`
/// }
/// tx.commit().await.map_err(classify)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct PgInbox;

impl PgInbox {
    /// Records `(message_id, consumer)` in the caller's transaction. `Ok(true)`: the key is
    /// new, apply the effect in the same transaction; `Ok(false)`: a duplicate, do nothing.
    ///
    /// While another open transaction holds the same key this waits for it: if that one
    /// commits this returns `false`, if it rolls back this one claims the key.
    pub async fn claim(
        conn: &mut PgConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, StoreError> {
        let inserted: Option<i32> = sqlx::query_scalar(
            "INSERT INTO mensajes_procesados (id_mensaje, consumidor) VALUES ($1, $2)
             ON CONFLICT DO NOTHING RETURNING 1",
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
    /// for a whole batch. A key repeated in `message_ids` is claimed once. Keys are inserted
    /// in sorted order, so two transactions claiming overlapping batches wait on each other
    /// instead of deadlocking.
    pub async fn claim_all(
        conn: &mut PgConnection,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        if message_ids.is_empty() {
            return Ok(std::collections::HashSet::new());
        }
        let claimed: Vec<String> = sqlx::query_scalar(
            "INSERT INTO mensajes_procesados (id_mensaje, consumidor)
             SELECT DISTINCT k.id, $2 FROM UNNEST($1::text[]) AS k(id) ORDER BY k.id
             ON CONFLICT DO NOTHING
             RETURNING id_mensaje",
        )
        .bind(message_ids)
        .bind(consumer)
        .fetch_all(conn)
        .await
        .map_err(classify)?;
        Ok(claimed.into_iter().collect())
    }

    /// Removes the keys `message_ids` of `consumer` in the caller's transaction; returns how
    /// many: gives back the keys [`claim_all`](Self::claim_all) took for messages the batch
    /// then refused, so they commit unrecorded as if never claimed.
    pub async fn unclaim_all(
        conn: &mut PgConnection,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<u64, StoreError> {
        if message_ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(
            "DELETE FROM mensajes_procesados WHERE consumidor = $2 AND id_mensaje = ANY($1::text[])",
        )
        .bind(message_ids)
        .bind(consumer)
        .execute(conn)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    /// Deletes keys recorded more than `age` ago (by `procesado_en`, on the database's
    /// clock); returns how many. Redeliveries older than `age` are then no longer detected.
    pub async fn purge_older_than(pool: &PgPool, age: Duration) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM mensajes_procesados
             WHERE procesado_en < now() - make_interval(secs => $1)",
        )
        .bind(age.as_secs_f64())
        .execute(pool)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    /// Number of keys recorded for `consumer`.
    pub async fn count(pool: &PgPool, consumer: &str) -> Result<u64, StoreError> {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM mensajes_procesados WHERE consumidor = $1")
                .bind(consumer)
                .fetch_one(pool)
                .await
                .map_err(classify)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}
