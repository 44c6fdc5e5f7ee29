//! Creating the slot: the rows committed before it existed are not in its stream, so they are
//! read in the snapshot the slot was created at and published first. Only then is the
//! creation recorded as complete, and the next session streams from the slot.

use std::sync::Arc;

use entrega_core::{Headers, OutboxRow, RawJson};
use entrega_postgres::wal::replication::ReplicationClient;
use entrega_postgres::wal::slot;
use sqlx::{PgConnection, Postgres, Transaction};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::prepare::store;
use super::publish;
use super::session::{stream_error, End};
use super::{WalError, WalRelay};
use crate::relay_config::bump;

/// A pending row as the catch-up selects it.
type Row = (
    Uuid,
    String,
    String,
    String,
    i32,
    String,
    i64,
    i64,
    Option<String>,
);

const ROW_COLUMNS: &str = "id, agregado, agregado_id, tipo, version, carga::text, \
     floor(extract(epoch FROM creado_en) * 1000)::bigint, seq, headers::text";

/// A step that waits on the server, or ends the creation when the relay shuts down.
async fn or_shutdown<T>(
    shutdown: &CancellationToken,
    step: impl std::future::Future<Output = Result<T, End>>,
) -> Result<T, End> {
    tokio::select! {
        done = step => done,
        () = shutdown.cancelled() => Err(End::Transient("shut down while creating the slot".into())),
    }
}

impl WalRelay {
    /// Creates the slot (dropping an earlier one when `recreate`, or one whose creation was
    /// cut short) and publishes the rows its stream will not carry. Only one relay does this
    /// at a time (an advisory lock on the slot's name); one that finds it taken waits.
    pub(super) async fn create(
        &self,
        name: &str,
        recreate: bool,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        let mut lock = self.pool.acquire().await.map_err(sql)?.detach();
        let held: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1))")
            .bind(format!("entrega_wal:{name}"))
            .fetch_one(&mut lock)
            .await
            .map_err(sql)?;
        if !held {
            return Err(End::SlotBusy(0));
        }
        // Another relay may have finished the creation while this one waited for the lock.
        let existing = slot::slot_state(&self.pool, name).await.map_err(store)?;
        let record = slot::slot_record(&self.pool, name).await.map_err(store)?;
        if existing.is_some() && record == Some(true) && !recreate {
            return Ok(());
        }
        if existing.is_some() {
            slot::forget_slot(&self.pool, name).await.map_err(store)?;
        }
        let generation = slot::record_slot_creation(&self.pool, name)
            .await
            .map_err(store)?;
        let published = or_shutdown(shutdown, self.publish_snapshot(name, shutdown)).await?;
        tracing::info!(
            slot = name,
            published,
            "replication slot created; the rows committed before it were published"
        );
        // Completed only if this creation is still the recorded one: had this relay's lock
        // been lost, another may have made the slot again meanwhile.
        let completed = slot::record_caught_up(&self.pool, name, &generation)
            .await
            .map_err(store)?;
        still_locked(&mut lock).await?;
        if !completed {
            return Err(End::Transient(
                "the slot was created again by another relay meanwhile".into(),
            ));
        }
        // Closing the connection releases the advisory lock.
        drop(lock);
        Ok(())
    }

    /// Creates the slot with an exported snapshot and publishes (and marks) the rows pending
    /// in that snapshot, read inside it, in publishing order. Returns how many.
    async fn publish_snapshot(&self, name: &str, shutdown: &CancellationToken) -> Result<u64, End> {
        let config = self.replication_config(name).await?;
        let mut session = ReplicationClient::connect_gated(config)
            .await
            .map_err(stream_error)?;
        // PostgreSQL makes the slot once the transactions running now have ended.
        let created = session
            .simple_query(&format!(
                "CREATE_REPLICATION_SLOT \"{name}\" LOGICAL pgoutput (SNAPSHOT 'export')"
            ))
            .await
            .map_err(stream_error)?;
        let snapshot = created
            .first()
            .and_then(|row| row.get(2))
            .and_then(|v| v.as_ref())
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned)
            .ok_or_else(|| End::Transient("CREATE_REPLICATION_SLOT returned no snapshot".into()))?;
        // The snapshot lives while the session that exported it waits; a transaction imports
        // it, then the rows pending at the slot's start are read in it, batch by batch.
        let mut tx = self.pool.begin().await.map_err(sql)?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        sqlx::query(&format!(
            "SET TRANSACTION SNAPSHOT '{}'",
            snapshot.replace('\'', "")
        ))
        .execute(&mut *tx)
        .await
        .map_err(sql)?;
        drop(session);
        let mut published = 0u64;
        let mut after = i64::MIN;
        loop {
            let rows = self.snapshot_rows(&mut tx, after).await?;
            let Some(last) = rows.last() else { break };
            after = last.seq;
            self.publish_and_mark(&rows, shutdown).await?;
            published += rows.len() as u64;
        }
        tx.commit().await.map_err(sql)?;
        Ok(published)
    }

    /// The next batch of rows pending in the snapshot after `seq` (rows held for an operator
    /// are left to the polling relay, which publishes them once released).
    async fn snapshot_rows(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        after: i64,
    ) -> Result<Vec<OutboxRow>, End> {
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {ROW_COLUMNS} FROM outbox \
             WHERE publicado_en IS NULL AND held_at IS NULL AND seq > $1 \
             ORDER BY seq LIMIT $2"
        ))
        .bind(after)
        .bind(i64::try_from(self.wal.max_batch.max(1)).unwrap_or(i64::MAX))
        .fetch_all(&mut **tx)
        .await
        .map_err(sql)?;
        rows.into_iter().map(outbox_row).collect()
    }

    /// Publishes `rows` in one call, retrying transient failures, then marks them.
    async fn publish_and_mark(
        &self,
        rows: &[OutboxRow],
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        let batch = Arc::new(publish::messages(&self.config, rows).map_err(|e| {
            End::Fatal(WalError::Stream(format!(
                "a pending row cannot be published: {e}"
            )))
        })?);
        let mut failures = 0u32;
        loop {
            let sent = publish::publish(
                Arc::clone(&self.publisher),
                Arc::clone(&self.stats),
                Arc::clone(&batch),
            )
            .await;
            match sent {
                Ok(()) => break,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let delay = self.config.backoff.delay(failures);
                    tracing::warn!(failures, ?delay, error = %e, "publishing pending outbox rows failed");
                    tokio::select! {
                        () = shutdown.cancelled() => return Err(End::Transient("shut down".into())),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        sqlx::query(
            "UPDATE outbox SET publicado_en = now() WHERE id = ANY($1) AND publicado_en IS NULL",
        )
        .bind(&ids)
        .execute(&self.pool)
        .await
        .map_err(sql)?;
        bump(&self.stats.published, ids.len() as u64);
        bump(&self.stats.batches, 1);
        Ok(())
    }
}

/// Whether the session holding the creation's advisory lock is still there (a lost
/// connection released the lock).
async fn still_locked(lock: &mut PgConnection) -> Result<(), End> {
    sqlx::query("SELECT 1")
        .execute(lock)
        .await
        .map(|_| ())
        .map_err(|e| End::Transient(format!("the slot's creation lock was lost: {e}")))
}

fn outbox_row(r: Row) -> Result<OutboxRow, End> {
    let bad = |why: String| End::Fatal(WalError::Stream(format!("row {}: {why}", r.0)));
    let payload =
        RawJson::parse(r.5.clone()).map_err(|e| bad(format!("carga is not JSON: {e}")))?;
    let version =
        u32::try_from(r.4).map_err(|_| bad(format!("version {} is out of range", r.4)))?;
    Ok(OutboxRow {
        id: r.0,
        aggregate: r.1,
        aggregate_id: r.2,
        kind: r.3,
        version,
        payload,
        created_at_ms: r.6,
        seq: r.7,
        attempts: 0,
        headers: r
            .8
            .as_deref()
            .map(Headers::from_json_object)
            .unwrap_or_default(),
    })
}

fn sql(e: sqlx::Error) -> End {
    store(entrega_postgres::classify(e))
}
