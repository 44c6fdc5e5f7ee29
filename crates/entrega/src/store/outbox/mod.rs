//! The transactional outbox (the seed's `outbox`, with entrega's lane, sequence, refusal and
//! header columns): enqueued in the caller's transaction, read per lane by the relay, marked
//! under a fenced lease, purged and reported, with wake-ups after commits.

mod lanes;
mod refused;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    lane_of, Clock, Headers, LaneCursor, LaneLease, LaneMark, LaneRows, NewEvent,
    OutboxMaintenance, OutboxReader, OutboxRow, OutboxStatus, OutboxWakeup, RawJson, Refusal,
    ReleaseError, StoreError,
};
use uuid::Uuid;

use super::wakeup::Waiter;
use crate::db::{query, query_each, Db, Query, TextList, TimeMs, Tx};
use crate::store::int4;

/// The outbox of one database as the relay sees it. Cheap to clone; each clone keeps its own
/// wake-up position.
#[derive(Debug, Clone)]
pub(crate) struct DbOutbox {
    db: Db,
    clock: Arc<dyn Clock>,
    waiter: Waiter,
}

impl DbOutbox {
    /// The outbox of `db`, reading time from `clock`.
    pub(crate) fn new(db: Db, clock: Arc<dyn Clock>) -> Self {
        let waiter = Waiter::outbox(&db);
        Self { db, clock, waiter }
    }

    /// The database of this outbox.
    pub(crate) fn db(&self) -> &Db {
        &self.db
    }
}

/// Writes `events`, in order, to the outbox in `tx`: they exist if and only if the business
/// change commits. On PostgreSQL they go in one statement, which computes each lane itself
/// (a generated column); SQLite is given it.
pub(crate) async fn enqueue_all(tx: &mut Tx, events: &[NewEvent]) -> Result<(), StoreError> {
    if let Some(conn) = tx.postgres() {
        if events.is_empty() {
            return Ok(());
        }
        return lanes::enqueue_many_postgres(conn, events).await;
    }
    for event in events {
        let statement = query(
            "INSERT INTO outbox (id, agregado, agregado_id, tipo, version, carga, headers, lane)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(event.id)
        .bind(&event.aggregate)
        .bind(&event.aggregate_id)
        .bind(&event.kind)
        .bind(version_of(event)?)
        .bind(crate::db::JsonText(event.payload.to_string()))
        .bind(event.headers.to_json_object())
        .bind(i64::from(lane_of(&event.aggregate_id)));
        tx.execute(statement).await?;
    }
    Ok(())
}

/// The event's version as stored (`INTEGER`).
fn version_of(event: &NewEvent) -> Result<i32, StoreError> {
    i32::try_from(event.version).map_err(|_| {
        StoreError::rejected(format!("event version {} is out of range", event.version))
    })
}

/// The columns every read of pending rows selects, in [`Row`] order, on table alias `o`,
/// with `$seq` the publishing sequence (SQLite's rowid, PostgreSQL's `seq`). Statement texts
/// are built at compile time: the relay's reads run many times a second.
macro_rules! row_columns {
    ($seq:literal) => {
        concat!(
            "CAST(o.lane AS BIGINT) AS lane, ",
            $seq,
            " AS seq, CAST(o.id AS TEXT) AS id, o.agregado, o.agregado_id, o.tipo, \
             CAST(o.version AS BIGINT) AS version, CAST(o.carga AS TEXT) AS carga, \
             CAST(o.attempts AS BIGINT) AS attempts, CAST(o.headers AS TEXT) AS headers, \
             o.creado_en"
        )
    };
}
pub(super) use row_columns;

/// A pending row as selected by [`ROW_COLUMNS`].
type Row = (
    i64,
    i64,
    String,
    String,
    String,
    String,
    i64,
    String,
    i64,
    Option<String>,
    TimeMs,
);

fn corrupt(reason: String) -> StoreError {
    StoreError::Corrupt {
        table: "outbox",
        reason,
    }
}

/// The lane and the row of a selected [`Row`].
fn decode(row: Row) -> Result<(u32, OutboxRow), StoreError> {
    let (lane, seq, id, aggregate, aggregate_id, kind, version, payload, attempts) = (
        row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8,
    );
    let id = Uuid::parse_str(&id).map_err(|e| corrupt(format!("id `{id}`: {e}")))?;
    let lane = u32::try_from(lane).map_err(|_| corrupt(format!("row {id}: lane {lane}")))?;
    let version =
        u32::try_from(version).map_err(|_| corrupt(format!("row {id}: version {version}")))?;
    let payload = RawJson::parse(payload)
        .map_err(|e| corrupt(format!("row {id}: carga is not JSON: {e}")))?;
    let row = OutboxRow {
        id,
        aggregate,
        aggregate_id,
        kind,
        version,
        payload,
        created_at_ms: row.10 .0,
        seq,
        attempts: u32::try_from(attempts).unwrap_or(0),
        headers: row
            .9
            .as_deref()
            .map(Headers::from_json_object)
            .unwrap_or_default(),
    };
    Ok((lane, row))
}

/// Ids as one list parameter.
fn id_list(ids: &[Uuid]) -> TextList {
    TextList(ids.iter().map(|id| id.hyphenated().to_string()).collect())
}

/// The lease still held as handed out, as a condition on `entrega_relay_lanes` with the lane,
/// owner and token bound at the three placeholders given.
macro_rules! lease_held_sql {
    ($lane:literal, $owner:literal, $token:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM entrega_relay_lanes WHERE lane = ",
            $lane,
            " AND owner = ",
            $owner,
            " AND token = ",
            $token,
            ")"
        )
    };
}
pub(super) use lease_held_sql;

/// Runs `statement`, which changes rows only while `lease` is held as handed out (the check
/// and the change are one statement). Nothing changed: either the lease is gone
/// ([`StoreError::LeaseLost`]) or the rows are (published or purged meanwhile).
async fn fenced(db: &Db, statement: Query, lease: &LaneLease) -> Result<(), StoreError> {
    if db.execute(statement).await? > 0 {
        return Ok(());
    }
    let held: Option<bool> = db
        .scalar(
            query(concat!("SELECT ", lease_held_sql!("$1", "$2", "$3")))
                .bind(int4(lease.lane))
                .bind(&lease.owner)
                .bind(lease.token),
        )
        .await?;
    if held.unwrap_or(false) {
        Ok(())
    } else {
        Err(StoreError::LeaseLost {
            what: format!("relay lane {}", lease.lane),
        })
    }
}

#[async_trait]
impl OutboxReader for DbOutbox {
    async fn pending(&self, lane: u32, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        let found = self.pending_lanes(&[lane], limit).await?;
        Ok(found.into_iter().flat_map(|f| f.rows).collect())
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
        // Fenced: a relay that lost its lane cannot mark anything, whatever happened since it
        // read the rows.
        let statement = query_each(
            concat!(
                "UPDATE outbox SET publicado_en = $1 WHERE lane = $2 AND publicado_en IS NULL \
                 AND id IN (SELECT value FROM json_each($5)) AND ",
                lease_held_sql!("$2", "$3", "$4")
            ),
            concat!(
                "UPDATE outbox SET publicado_en = $1 \
                 WHERE id = ANY(CAST($5 AS uuid[])) AND publicado_en IS NULL AND ",
                lease_held_sql!("$2", "$3", "$4")
            ),
        )
        .bind(TimeMs(now_ms))
        .bind(int4(lease.lane))
        .bind(&lease.owner)
        .bind(lease.token)
        .bind(id_list(ids));
        fenced(&self.db, statement, lease).await
    }

    async fn record_refusal(
        &self,
        lease: &LaneLease,
        refusal: &Refusal,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        refused::record(&self.db, lease, refusal, now_ms).await
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
        self.pending_lanes_after(&cursors, limit).await
    }

    async fn pending_lanes_after(
        &self,
        cursors: &[LaneCursor],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        let now = self.clock.now_ms();
        lanes::pending_lanes(&self.db, cursors, limit, now).await
    }

    async fn mark_published_lanes(
        &self,
        marks: &[LaneMark],
        now_ms: i64,
    ) -> Result<Vec<u32>, StoreError> {
        lanes::mark_published_lanes(&self.db, marks, now_ms).await
    }
}

#[async_trait]
impl OutboxMaintenance for DbOutbox {
    async fn purge_published(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.db
            .execute(
                query("DELETE FROM outbox WHERE publicado_en IS NOT NULL AND publicado_en < $1")
                    .bind(TimeMs(before_ms)),
            )
            .await
    }

    async fn status(&self, now_ms: i64) -> Result<OutboxStatus, StoreError> {
        let (pending, oldest, published): (i64, Option<TimeMs>, i64) = self
            .db
            .fetch_optional(query(
                "SELECT (SELECT COUNT(*) FROM outbox WHERE publicado_en IS NULL),
                        (SELECT MIN(creado_en) FROM outbox WHERE publicado_en IS NULL),
                        (SELECT COUNT(*) FROM outbox WHERE publicado_en IS NOT NULL)",
            ))
            .await?
            .unwrap_or((0, None, 0));
        let (retrying, held, blocked) = refused::listed(&self.db).await?;
        Ok(OutboxStatus {
            pending: u64::try_from(pending).unwrap_or(0),
            oldest_pending_age_ms: oldest.map_or(0, |oldest| (now_ms - oldest.0).max(0)),
            published: u64::try_from(published).unwrap_or(0),
            retrying,
            held,
            blocked,
        })
    }

    async fn release(&self, id: Uuid) -> Result<(), ReleaseError> {
        refused::release(&self.db, id).await
    }
}

#[async_trait]
impl OutboxWakeup for DbOutbox {
    async fn wait(&self, timeout: Duration) {
        self.waiter.wait(timeout).await;
    }
}
