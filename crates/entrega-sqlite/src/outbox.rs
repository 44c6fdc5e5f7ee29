//! The transactional outbox on SQLite: enqueue in the caller's transaction, read pending rows
//! per lane, mark them published under a fenced lease, purge and report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    lane_of, Clock, Headers, LaneCursor, LaneLease, LaneMark, LaneRows, NewEvent,
    OutboxMaintenance, OutboxReader, OutboxRow, OutboxStatus, OutboxWakeup, RawJson, Refusal,
    ReleaseError, StoreError, SystemClock,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection, SqlitePool};
use uuid::Uuid;

use crate::connect::begin_immediate;
use crate::errors::{classify, corrupt};
use crate::outbox_blocked::UNBLOCKED;
use crate::timefmt::{epoch_ms_sql, format_ms};
use crate::wakeup::{signals_for, DbSignals};

/// The outbox of a SQLite database, as the relay sees it. Cheap to clone.
///
/// Rows are written with [`SqliteOutbox::enqueue`] inside the caller's own transaction and
/// read back by the relay through the `entrega-core` traits ([`OutboxReader`],
/// [`entrega_core::LaneLeases`], [`OutboxMaintenance`], [`OutboxWakeup`]).
#[derive(Debug)]
pub struct SqliteOutbox {
    pub(crate) pool: SqlitePool,
    clock: Arc<dyn Clock>,
    signals: Arc<DbSignals>,
    /// The wake-up generation this handle last returned on; per handle, so relays holding
    /// separate clones do not consume each other's wake-ups.
    seen: AtomicU64,
}

impl Clone for SqliteOutbox {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            clock: Arc::clone(&self.clock),
            signals: Arc::clone(&self.signals),
            seen: AtomicU64::new(self.seen.load(Ordering::SeqCst)),
        }
    }
}

impl SqliteOutbox {
    /// The outbox of `pool`'s database, on the system clock.
    pub fn new(pool: SqlitePool) -> Self {
        Self::with_clock(pool, Arc::new(SystemClock))
    }

    /// The outbox of `pool`'s database, reading time from `clock`.
    pub fn with_clock(pool: SqlitePool, clock: Arc<dyn Clock>) -> Self {
        let signals = signals_for(&pool.connect_options());
        let seen = AtomicU64::new(signals.outbox.current());
        Self {
            pool,
            clock,
            signals,
            seen,
        }
    }

    /// The pool this outbox works on.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The clock this outbox was built with.
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    /// Writes `event` to the outbox inside the caller's transaction, so the event exists if
    /// and only if the business change commits: `SqliteOutbox::enqueue(&mut *tx, &event)`.
    pub async fn enqueue(conn: &mut SqliteConnection, event: &NewEvent) -> Result<(), StoreError> {
        let payload = serde_json::to_string(&event.payload).map_err(StoreError::rejected)?;
        sqlx::query(
            "INSERT INTO outbox (id, agregado, agregado_id, tipo, version, carga, lane, cabeceras)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(event.id.hyphenated().to_string())
        .bind(&event.aggregate)
        .bind(&event.aggregate_id)
        .bind(&event.kind)
        .bind(i64::from(event.version))
        .bind(payload)
        .bind(i64::from(lane_of(&event.aggregate_id)))
        .bind(event.headers.to_json_object())
        .execute(conn)
        .await
        .map_err(classify)?;
        Ok(())
    }

    /// Writes every event, in order, inside the caller's transaction.
    pub async fn enqueue_all(
        conn: &mut SqliteConnection,
        events: &[NewEvent],
    ) -> Result<(), StoreError> {
        for event in events {
            Self::enqueue(&mut *conn, event).await?;
        }
        Ok(())
    }
}

pub(crate) fn decode_row(row: &SqliteRow) -> Result<OutboxRow, StoreError> {
    let get_err = |e: sqlx::Error| corrupt("outbox", e);
    let id: String = row.try_get("id").map_err(get_err)?;
    let id = Uuid::parse_str(&id).map_err(|e| corrupt("outbox", format!("id `{id}`: {e}")))?;
    let version: i64 = row.try_get("version").map_err(get_err)?;
    let version = u32::try_from(version).map_err(|_| {
        corrupt(
            "outbox",
            format!("row {id}: version {version} out of range"),
        )
    })?;
    let payload: String = row.try_get("carga").map_err(get_err)?;
    let payload = RawJson::parse(payload)
        .map_err(|e| corrupt("outbox", format!("row {id}: carga is not JSON: {e}")))?;
    let created_at_ms: Option<i64> = row.try_get("created_ms").map_err(get_err)?;
    let created_at_ms = created_at_ms
        .ok_or_else(|| corrupt("outbox", format!("row {id}: creado_en is not a timestamp")))?;
    let attempts: i64 = row.try_get("intentos").map_err(get_err)?;
    let headers: Option<String> = row.try_get("cabeceras").map_err(get_err)?;
    Ok(OutboxRow {
        id,
        aggregate: row.try_get("agregado").map_err(get_err)?,
        aggregate_id: row.try_get("agregado_id").map_err(get_err)?,
        kind: row.try_get("tipo").map_err(get_err)?,
        version,
        payload,
        created_at_ms,
        seq: row.try_get("seq").map_err(get_err)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        headers: headers
            .as_deref()
            .map(Headers::from_json_object)
            .unwrap_or_default(),
    })
}

pub(crate) fn json_ids(ids: &[Uuid]) -> String {
    let ids: Vec<String> = ids.iter().map(|id| id.hyphenated().to_string()).collect();
    serde_json::Value::from(ids).to_string()
}

#[async_trait]
impl OutboxReader for SqliteOutbox {
    async fn pending(&self, lane: u32, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        // rowid order is insertion order: new rows always get a rowid above every row still
        // present, and pending rows are never deleted.
        let sql = format!(
            "SELECT o.rowid AS seq, o.id, o.agregado, o.agregado_id, o.tipo, o.version, o.carga,
                    o.intentos, o.cabeceras, {} AS created_ms
             FROM outbox o
             WHERE o.lane = ? AND o.publicado_en IS NULL AND {UNBLOCKED}
             ORDER BY o.rowid
             LIMIT ?",
            epoch_ms_sql("o.creado_en")
        );
        let rows = sqlx::query(&sql)
            .bind(i64::from(lane))
            .bind(i64::from(lane))
            .bind(format_ms(self.clock.now_ms()))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(classify)?;
        rows.iter().map(decode_row).collect()
    }

    async fn mark_published(
        &self,
        lease: &LaneLease,
        ids: &[Uuid],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut tx = begin_immediate(&self.pool).await?;
        // The fence and the update share one write transaction: no successor can take the
        // lane between the check and the write.
        crate::outbox_blocked::ensure_held(&mut tx, lease).await?;
        sqlx::query(
            "UPDATE outbox SET publicado_en = ?
             WHERE lane = ? AND publicado_en IS NULL
               AND id IN (SELECT value FROM json_each(?))",
        )
        .bind(format_ms(now_ms))
        .bind(i64::from(lease.lane))
        .bind(json_ids(ids))
        .execute(&mut *tx)
        .await
        .map_err(classify)?;
        tx.commit().await.map_err(classify)
    }

    async fn record_refusal(
        &self,
        lease: &LaneLease,
        refusal: &Refusal,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        crate::outbox_blocked::record_refusal(&self.pool, lease, refusal, now_ms).await
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

    async fn mark_published_lanes(
        &self,
        marks: &[LaneMark],
        now_ms: i64,
    ) -> Result<Vec<u32>, StoreError> {
        crate::outbox_lanes::mark_published_lanes(&self.pool, marks, now_ms).await
    }
}

#[async_trait]
impl OutboxMaintenance for SqliteOutbox {
    async fn purge_published(&self, before_ms: i64) -> Result<u64, StoreError> {
        let done =
            sqlx::query("DELETE FROM outbox WHERE publicado_en IS NOT NULL AND publicado_en < ?")
                .bind(format_ms(before_ms))
                .execute(&self.pool)
                .await
                .map_err(classify)?;
        Ok(done.rows_affected())
    }

    async fn status(&self, now_ms: i64) -> Result<OutboxStatus, StoreError> {
        let sql = format!(
            "SELECT
                 (SELECT COUNT(*) FROM outbox WHERE publicado_en IS NULL) AS pending,
                 (SELECT MIN({}) FROM outbox WHERE publicado_en IS NULL) AS oldest_ms,
                 (SELECT COUNT(*) FROM outbox WHERE publicado_en IS NOT NULL) AS published",
            epoch_ms_sql("creado_en")
        );
        let row = sqlx::query(&sql)
            .fetch_one(&self.pool)
            .await
            .map_err(classify)?;
        let get_err = |e: sqlx::Error| corrupt("outbox", e);
        let pending: i64 = row.try_get("pending").map_err(get_err)?;
        let oldest: Option<i64> = row.try_get("oldest_ms").map_err(get_err)?;
        let published: i64 = row.try_get("published").map_err(get_err)?;
        let (retrying, held, blocked) = crate::outbox_blocked::refused(&self.pool).await?;
        Ok(OutboxStatus {
            pending: u64::try_from(pending).unwrap_or(0),
            oldest_pending_age_ms: oldest.map_or(0, |oldest| (now_ms - oldest).max(0)),
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
impl OutboxWakeup for SqliteOutbox {
    async fn wait(&self, timeout: Duration) {
        let seen = self.seen.load(Ordering::SeqCst);
        let now = self.signals.outbox.wait_past(seen, timeout).await;
        self.seen.store(now, Ordering::SeqCst);
    }
}
