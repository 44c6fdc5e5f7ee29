//! The idempotent consumer's keys in the seed's `mensajes_procesados`: claimed in the
//! effect's own transaction, so key and effect commit together or not at all.

use std::collections::HashSet;
use std::time::Duration;

use entrega_core::StoreError;

use crate::db::{query, query_each, Backend, Db, TextList, TimeMs, Tx};

impl Tx {
    /// Records that `consumer` processed `message_id`, in this transaction. `true`: the key
    /// is new, apply the effect here. `false`: a duplicate, apply nothing. On PostgreSQL, while another open
    /// transaction holds the same key this waits for it: if that one commits this is a
    /// duplicate, if it rolls back this one claims the key.
    pub async fn claim(&mut self, consumer: &str, message_id: &str) -> Result<bool, StoreError> {
        let inserted: Option<i32> = self
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

    /// Records every key of `message_ids` for `consumer` in one statement and returns the new
    /// ones: a batch's keys claimed at once, the first step of a set-based batch apply (then
    /// read what the batch needs, decide each message in order in memory, write the effects
    /// set-based, and [`unclaim_all`](Tx::unclaim_all) the keys of refused messages). A key
    /// repeated in the list is claimed once. On PostgreSQL the keys go in
    /// sorted order, so two transactions claiming overlapping batches wait on each other
    /// instead of deadlocking.
    pub async fn claim_all(
        &mut self,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<HashSet<String>, StoreError> {
        if message_ids.is_empty() {
            return Ok(HashSet::new());
        }
        let claimed: Vec<(String,)> = self
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

    /// Removes keys of `consumer` claimed earlier in this transaction (messages a batch refused
    /// after [`claim_all`](Tx::claim_all)), so they commit unrecorded; returns how many.
    pub async fn unclaim_all(
        &mut self,
        consumer: &str,
        message_ids: &[&str],
    ) -> Result<u64, StoreError> {
        if message_ids.is_empty() {
            return Ok(0);
        }
        self.execute(
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
}

impl Db {
    /// Deletes processed-message keys recorded more than `age` ago; returns how many. A
    /// message redelivered after its key is gone would be applied again, so `age` must exceed
    /// the broker's redelivery window. On SQLite the cut is computed here, in the column's own
    /// text form (so the comparison and its index are exact); on PostgreSQL on the database's
    /// clock.
    pub async fn purge_processed(&self, age: Duration) -> Result<u64, StoreError> {
        let statement = match self.backend() {
            Backend::Sqlite => {
                let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
                let cutoff = entrega_core::now_ms().saturating_sub(age_ms);
                query("DELETE FROM mensajes_procesados WHERE procesado_en < $1")
                    .bind(TimeMs(cutoff))
            }
            Backend::Postgres => query(
                "DELETE FROM mensajes_procesados
                 WHERE procesado_en < now() - make_interval(secs => $1)",
            )
            .bind(age.as_secs_f64()),
        };
        self.execute(statement).await
    }

    /// Keys recorded for `consumer`: messages it applied.
    pub async fn processed(&self, consumer: &str) -> Result<u64, StoreError> {
        let n: Option<i64> = self
            .scalar(
                query("SELECT COUNT(*) FROM mensajes_procesados WHERE consumidor = $1")
                    .bind(consumer),
            )
            .await?;
        Ok(n.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }
}
