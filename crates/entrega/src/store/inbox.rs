//! The idempotent consumer's keys in the seed's `mensajes_procesados`: claimed in the
//! effect's own transaction, so key and effect commit together or not at all.

use std::collections::HashSet;
use std::time::Duration;

use entrega_core::StoreError;

use crate::db::{query, query_each, Backend, Db, TextList, TimeMs, Tx};

/// Records `(message_id, consumer)` in `tx`: `true` when the key is new (apply the effect in
/// the same transaction), `false` for a duplicate. On PostgreSQL, while another open
/// transaction holds the same key this waits for it: if that one commits this is a
/// duplicate, if it rolls back this one claims the key.
pub(crate) async fn claim(
    tx: &mut Tx,
    consumer: &str,
    message_id: &str,
) -> Result<bool, StoreError> {
    let inserted: Option<i32> = tx
        .scalar(
            query(
                "INSERT INTO mensajes_procesados (id_mensaje, consumidor) VALUES ($1, $2)
                 ON CONFLICT DO NOTHING RETURNING 1",
            )
            .bind(message_id)
            .bind(consumer),
        )
        .await?;
    Ok(inserted.is_some())
}

/// Records every key of `message_ids` for `consumer` in one statement of `tx` and returns
/// the new ones. A key repeated in the list is claimed once. On PostgreSQL the keys go in
/// sorted order, so two transactions claiming overlapping batches wait on each other
/// instead of deadlocking.
pub(crate) async fn claim_all(
    tx: &mut Tx,
    consumer: &str,
    message_ids: &[&str],
) -> Result<HashSet<String>, StoreError> {
    if message_ids.is_empty() {
        return Ok(HashSet::new());
    }
    let claimed: Vec<(String,)> = tx
        .fetch_all(
            query_each(
                // `WHERE true` tells SQLite's parser the `ON CONFLICT` belongs to the insert.
                "INSERT INTO mensajes_procesados (id_mensaje, consumidor)
                 SELECT DISTINCT k.value, $2 FROM json_each($1) AS k WHERE true
                 ON CONFLICT DO NOTHING RETURNING id_mensaje",
                "INSERT INTO mensajes_procesados (id_mensaje, consumidor)
                 SELECT DISTINCT k.id, $2 FROM UNNEST($1::text[]) AS k(id) ORDER BY k.id
                 ON CONFLICT DO NOTHING RETURNING id_mensaje",
            )
            .bind(TextList::of(message_ids))
            .bind(consumer),
        )
        .await?;
    Ok(claimed.into_iter().map(|(id,)| id).collect())
}

/// Removes the keys `message_ids` of `consumer` in `tx` (those a batch claimed and then
/// refused, so they commit unrecorded); returns how many.
pub(crate) async fn unclaim_all(
    tx: &mut Tx,
    consumer: &str,
    message_ids: &[&str],
) -> Result<u64, StoreError> {
    if message_ids.is_empty() {
        return Ok(0);
    }
    tx.execute(
        query_each(
            "DELETE FROM mensajes_procesados
             WHERE consumidor = $2 AND id_mensaje IN (SELECT value FROM json_each($1))",
            "DELETE FROM mensajes_procesados WHERE consumidor = $2 AND id_mensaje = ANY($1::text[])",
        )
        .bind(TextList::of(message_ids))
        .bind(consumer),
    )
    .await
}

/// Deletes keys recorded more than `age` ago; returns how many. On SQLite the cut is
/// computed here, in the column's own text form (so the comparison and its index are
/// exact); on PostgreSQL on the database's clock.
pub(crate) async fn purge_older_than(db: &Db, age: Duration) -> Result<u64, StoreError> {
    let statement = match db.backend() {
        Backend::Sqlite => {
            let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
            let cutoff = entrega_core::now_ms().saturating_sub(age_ms);
            query("DELETE FROM mensajes_procesados WHERE procesado_en < $1").bind(TimeMs(cutoff))
        }
        Backend::Postgres => query(
            "DELETE FROM mensajes_procesados
             WHERE procesado_en < now() - make_interval(secs => $1)",
        )
        .bind(age.as_secs_f64()),
    };
    db.execute(statement).await
}

/// The number of keys recorded for `consumer`.
pub(crate) async fn count(db: &Db, consumer: &str) -> Result<u64, StoreError> {
    let n: Option<i64> = db
        .scalar(
            query("SELECT COUNT(*) FROM mensajes_procesados WHERE consumidor = $1").bind(consumer),
        )
        .await?;
    Ok(n.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
}
