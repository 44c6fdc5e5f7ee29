//! Creating the slot: the rows committed before it existed are not in its stream, so they are
//! read in the snapshot the slot was created at and published first. Only then is the
//! creation recorded as complete, and the next session streams from the slot.

use std::sync::Arc;

use entrega_core::{Headers, OutboxRow, RawJson};
use entrega_postgres::wal::replication::ReplicationClient;
use entrega_postgres::wal::{replication_config, slot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::prepare::store;
use super::publish;
use super::session::{stream_error, End};
use super::WalRelay;
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

impl WalRelay {
    /// Creates the slot and publishes the rows its stream will not carry. Only one relay does
    /// this at a time (an advisory lock on the slot's name); one that finds it taken waits.
    pub(super) async fn create(&self, name: &str, shutdown: &CancellationToken) -> Result<(), End> {
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
        if existing.is_some() && record == Some(true) && !self.wal.recreate_slot {
            return Ok(());
        }
        if existing.is_some() {
            slot::forget_slot(&self.pool, name).await.map_err(store)?;
        }
        slot::record_slot_creation(&self.pool, name)
            .await
            .map_err(store)?;
        let pending = self.pending_in_new_slot(name).await?;
        tracing::info!(
            slot = name,
            pending = pending.len(),
            "replication slot created; publishing the rows committed before it"
        );
        self.publish_pending(&pending, shutdown).await?;
        slot::record_caught_up(&self.pool, name)
            .await
            .map_err(store)?;
        // Closing the connection releases the advisory lock.
        drop(lock);
        Ok(())
    }

    /// Creates the slot with an exported snapshot and returns the ids of the rows pending in
    /// that snapshot, in publishing order.
    async fn pending_in_new_slot(&self, name: &str) -> Result<Vec<Uuid>, End> {
        let config =
            replication_config(&self.url, name, slot::PUBLICATION, self.wal.status_interval)
                .map_err(store)?;
        let mut session = ReplicationClient::connect_gated(config)
            .await
            .map_err(stream_error)?;
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
        // The snapshot lives while the session that exported it waits; it is imported by a
        // transaction that reads what was pending at the slot's start.
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
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM outbox WHERE publicado_en IS NULL AND held_at IS NULL ORDER BY seq",
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(sql)?;
        tx.commit().await.map_err(sql)?;
        drop(session);
        Ok(ids)
    }

    /// Publishes and marks `ids` batch by batch, in order, retrying transient failures.
    async fn publish_pending(&self, ids: &[Uuid], shutdown: &CancellationToken) -> Result<(), End> {
        for chunk in ids.chunks(self.wal.max_batch.max(1)) {
            let rows = self.rows(chunk).await?;
            if rows.is_empty() {
                continue;
            }
            let batch =
                Arc::new(publish::messages(&self.config, &rows).map_err(|e| {
                    End::Transient(format!("a pending row cannot be published: {e}"))
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
            let published: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
            sqlx::query(
                "UPDATE outbox SET publicado_en = now() WHERE id = ANY($1) AND publicado_en IS NULL",
            )
            .bind(&published)
            .execute(&self.pool)
            .await
            .map_err(sql)?;
            bump(&self.stats.published, published.len() as u64);
            bump(&self.stats.batches, 1);
        }
        Ok(())
    }

    /// The rows of `ids` still pending, in publishing order.
    async fn rows(&self, ids: &[Uuid]) -> Result<Vec<OutboxRow>, End> {
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {ROW_COLUMNS} FROM outbox WHERE id = ANY($1) AND publicado_en IS NULL \
             ORDER BY seq"
        ))
        .bind(ids)
        .fetch_all(&self.pool)
        .await
        .map_err(sql)?;
        rows.into_iter()
            .map(|r| {
                let payload = RawJson::parse(r.5).map_err(|e| {
                    End::Fatal(super::WalError::Stream(format!(
                        "row {}: carga is not JSON: {e}",
                        r.0
                    )))
                })?;
                Ok(OutboxRow {
                    id: r.0,
                    aggregate: r.1,
                    aggregate_id: r.2,
                    kind: r.3,
                    version: u32::try_from(r.4).unwrap_or(1),
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
            })
            .collect()
    }
}

fn sql(e: sqlx::Error) -> End {
    store(entrega_postgres::classify(e))
}
