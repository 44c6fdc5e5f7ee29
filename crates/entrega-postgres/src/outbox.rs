//! The transactional outbox: enqueueing in the caller's transaction, reading pending rows
//! per lane, fenced marking, maintenance and commit wake-ups.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    Clock, Headers, LaneCursor, LaneLease, LaneMark, LaneRows, NewEvent, OutboxMaintenance,
    OutboxReader, OutboxRow, OutboxStatus, OutboxWakeup, RawJson, Refusal, ReleaseError,
    StoreError, SystemClock,
};
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::types::Json;
use sqlx::Row;
use tokio::sync::{watch, Mutex};
use uuid::Uuid;

use crate::errors::{classify, invalid};
use crate::wakeup::Listener;

/// Channel the outbox trigger notifies after every inserting statement.
pub(crate) const OUTBOX_CHANNEL: &str = "entrega_outbox";

/// The outbox on PostgreSQL. Cheap to clone; each clone keeps its own wake-up position.
#[derive(Debug)]
pub struct PgOutbox {
    pub(crate) pool: PgPool,
    clock: Arc<dyn Clock>,
    listener: Listener,
    /// Remembers the last notification seen by this handle, so a commit signalled between
    /// two `wait` calls still wakes the next one.
    seen: Mutex<watch::Receiver<u64>>,
}

impl Clone for PgOutbox {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            clock: Arc::clone(&self.clock),
            listener: self.listener.clone(),
            seen: Mutex::new(self.listener.subscribe("")),
        }
    }
}

impl PgOutbox {
    /// An outbox on `pool`, with the system clock.
    pub fn new(pool: PgPool) -> Self {
        Self::with_clock(pool, Arc::new(SystemClock))
    }

    /// An outbox on `pool` with an explicit clock.
    pub fn with_clock(pool: PgPool, clock: Arc<dyn Clock>) -> Self {
        let listener = Listener::new(pool.clone(), OUTBOX_CHANNEL);
        let seen = Mutex::new(listener.subscribe(""));
        Self {
            pool,
            clock,
            listener,
            seen,
        }
    }

    /// The pool this outbox works on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The clock this outbox was built with (for relays driving it).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Enqueues one event inside the caller's transaction:
    /// `PgOutbox::enqueue(&mut *tx, &event).await?`. It becomes visible to the relay when
    /// that transaction commits, and disappears with it on rollback.
    pub async fn enqueue(conn: &mut PgConnection, event: &NewEvent) -> Result<(), StoreError> {
        let version = version_of(event)?;
        sqlx::query(
            "INSERT INTO outbox (id, agregado, agregado_id, tipo, version, carga, cabeceras)
             VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)",
        )
        .bind(event.id)
        .bind(&event.aggregate)
        .bind(&event.aggregate_id)
        .bind(&event.kind)
        .bind(version)
        .bind(Json(&event.payload))
        .bind(event.headers.to_json_object())
        .execute(conn)
        .await
        .map_err(classify)?;
        Ok(())
    }

    /// Enqueues several events in the caller's transaction with one statement, in order
    /// (events of one aggregate keep their relative order).
    pub async fn enqueue_all(
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut ids = Vec::with_capacity(events.len());
        let mut aggregates = Vec::with_capacity(events.len());
        let mut aggregate_ids = Vec::with_capacity(events.len());
        let mut kinds = Vec::with_capacity(events.len());
        let mut versions = Vec::with_capacity(events.len());
        let mut payloads = Vec::with_capacity(events.len());
        let mut headers = Vec::with_capacity(events.len());
        for e in events {
            ids.push(e.id);
            aggregates.push(e.aggregate.as_str());
            aggregate_ids.push(e.aggregate_id.as_str());
            kinds.push(e.kind.as_str());
            versions.push(version_of(e)?);
            payloads.push(e.payload.to_string());
            headers.push(e.headers.to_json_object());
        }
        // ORDER BY ord: `seq` defaults are drawn in the order rows reach the insert.
        sqlx::query(
            "INSERT INTO outbox (id, agregado, agregado_id, tipo, version, carga, cabeceras)
             SELECT u.id, u.agregado, u.agregado_id, u.tipo, u.version, u.carga::jsonb,
                    u.cabeceras::jsonb
             FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::text[],
                         $7::text[])
                  WITH ORDINALITY AS u(id, agregado, agregado_id, tipo, version, carga,
                                       cabeceras, ord)
             ORDER BY u.ord",
        )
        .bind(&ids)
        .bind(&aggregates)
        .bind(&aggregate_ids)
        .bind(&kinds)
        .bind(&versions)
        .bind(&payloads)
        .bind(&headers)
        .execute(conn)
        .await
        .map_err(classify)?;
        Ok(())
    }
}

/// Epoch ms kept within what `timestamptz` can hold (about year 33658 either way), so
/// "everything" sentinels such as `i64::MAX` work as bounds.
pub(crate) fn timestamp_ms(ms: i64) -> i64 {
    const LIMIT: i64 = 1_000_000_000_000_000;
    ms.clamp(-LIMIT, LIMIT)
}

fn version_of(event: &NewEvent) -> Result<i32, StoreError> {
    i32::try_from(event.version)
        .map_err(|_| invalid(format!("event version {} is out of range", event.version)))
}

pub(crate) fn row_of(row: &PgRow) -> Result<OutboxRow, StoreError> {
    let version: i32 = row.try_get("version").map_err(classify)?;
    let attempts: i32 = row.try_get("intentos").map_err(classify)?;
    // Kept as text: the relay writes it into the envelope without looking inside.
    let payload: Json<RawJson> = row.try_get("carga").map_err(classify)?;
    Ok(OutboxRow {
        id: row.try_get("id").map_err(classify)?,
        aggregate: row.try_get("agregado").map_err(classify)?,
        aggregate_id: row.try_get("agregado_id").map_err(classify)?,
        kind: row.try_get("tipo").map_err(classify)?,
        version: u32::try_from(version).map_err(|_| StoreError::Corrupt {
            table: "outbox",
            reason: format!("negative version {version}"),
        })?,
        payload: payload.0,
        created_at_ms: row.try_get("created_at_ms").map_err(classify)?,
        seq: row.try_get("seq").map_err(classify)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        headers: headers_of(row)?,
    })
}

/// The `cabeceras` column, read as text (`cabeceras::text AS cabeceras`).
pub(crate) fn headers_of(row: &PgRow) -> Result<Headers, StoreError> {
    let text: Option<String> = row.try_get("cabeceras").map_err(classify)?;
    Ok(text
        .as_deref()
        .map(Headers::from_json_object)
        .unwrap_or_default())
}

#[async_trait]
impl OutboxReader for PgOutbox {
    async fn pending(&self, lane: u32, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        // The lane statement with one lane: the same filter of blocked aggregates, one query.
        let cursor = LaneCursor {
            lane,
            after_seq: i64::MIN,
        };
        let now = self.clock.now_ms();
        let found = crate::outbox_lanes::pending_lanes(&self.pool, &[cursor], limit, now).await?;
        Ok(found.into_iter().flat_map(|f| f.rows).collect())
    }

    async fn mark_published(
        &self,
        lease: &LaneLease,
        ids: &[Uuid],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let lane = i32::try_from(lease.lane).map_err(|_| invalid("lane out of range"))?;
        // The lease check and the update are one statement: a relay that lost its lane
        // cannot mark anything, whatever happened since it read the rows.
        let done = sqlx::query(
            "UPDATE outbox SET publicado_en = to_timestamp($1::float8 / 1000.0)
             WHERE id = ANY($2)
               AND EXISTS (SELECT 1 FROM entrega_relay_lanes
                           WHERE lane = $3 AND owner = $4 AND token = $5)",
        )
        .bind(timestamp_ms(now_ms))
        .bind(ids)
        .bind(lane)
        .bind(&lease.owner)
        .bind(lease.token)
        .execute(&self.pool)
        .await
        .map_err(classify)?;
        if done.rows_affected() > 0 || ids.is_empty() {
            return Ok(());
        }
        // Nothing matched: either the lease is gone or the rows are (purged meanwhile).
        if crate::outbox_blocked::lease_held(&self.pool, lease).await? {
            Ok(())
        } else {
            Err(StoreError::LeaseLost {
                what: format!("relay lane {}", lease.lane),
            })
        }
    }

    async fn pending_lanes(
        &self,
        lanes: &[u32],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        let cursors: Vec<LaneCursor> = lanes
            .iter()
            .map(|&lane| LaneCursor {
                lane,
                after_seq: i64::MIN,
            })
            .collect();
        let now = self.clock.now_ms();
        crate::outbox_lanes::pending_lanes(&self.pool, &cursors, limit, now).await
    }

    async fn pending_lanes_after(
        &self,
        cursors: &[LaneCursor],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        let now = self.clock.now_ms();
        crate::outbox_lanes::pending_lanes(&self.pool, cursors, limit, now).await
    }

    async fn record_refusal(
        &self,
        lease: &LaneLease,
        refusal: &Refusal,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        crate::outbox_blocked::record_refusal(&self.pool, lease, refusal, now_ms).await
    }

    async fn mark_published_lanes(
        &self,
        marks: &[LaneMark],
        now_ms: i64,
    ) -> Result<Vec<u32>, StoreError> {
        crate::outbox_lanes::mark_published_lanes(&self.pool, marks, now_ms).await
    }
}

#[async_trait]
impl OutboxMaintenance for PgOutbox {
    async fn purge_published(&self, before_ms: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM outbox
             WHERE publicado_en IS NOT NULL AND publicado_en < to_timestamp($1::float8 / 1000.0)",
        )
        .bind(timestamp_ms(before_ms))
        .execute(&self.pool)
        .await
        .map_err(classify)?;
        Ok(done.rows_affected())
    }

    async fn status(&self, now_ms: i64) -> Result<OutboxStatus, StoreError> {
        let row = sqlx::query(
            "SELECT count(*) FILTER (WHERE publicado_en IS NULL) AS pending,
                    (extract(epoch FROM min(creado_en) FILTER (WHERE publicado_en IS NULL))
                        * 1000)::bigint AS oldest_ms,
                    count(*) FILTER (WHERE publicado_en IS NOT NULL) AS published
             FROM outbox",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(classify)?;
        let pending: i64 = row.try_get("pending").map_err(classify)?;
        let oldest: Option<i64> = row.try_get("oldest_ms").map_err(classify)?;
        let published: i64 = row.try_get("published").map_err(classify)?;
        let (retrying, held, blocked) = crate::outbox_blocked::refused(&self.pool).await?;
        Ok(OutboxStatus {
            pending: u64::try_from(pending).unwrap_or(0),
            oldest_pending_age_ms: oldest.map_or(0, |t| (now_ms - t).max(0)),
            published: u64::try_from(published).unwrap_or(0),
            retrying,
            held,
            blocked,
        })
    }

    async fn release(&self, id: Uuid) -> Result<(), ReleaseError> {
        crate::outbox_blocked::release(&self.pool, id).await
    }
}

#[async_trait]
impl OutboxWakeup for PgOutbox {
    async fn wait(&self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let Ok(mut seen) = tokio::time::timeout_at(deadline, self.seen.lock()).await else {
            return;
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        // Without a listener there is nothing to wait for but the timeout itself.
        if !self.listener.wait(&mut seen, left, left).await {
            tokio::time::sleep_until(deadline).await;
        }
    }
}
