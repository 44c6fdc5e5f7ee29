//! The server side of a WAL relay: `wal_level`, the publication of the outbox's inserts, the
//! replication slot's state and WAL, the record of the slots entrega created, and the
//! heartbeat that keeps an idle slot moving.

use entrega_core::StoreError;
use sqlx::PgPool;

use crate::errors::classify;

/// The publication of the outbox's inserts (updates, deletes and truncates are left out:
/// the relay's own marks and purges never reach the stream).
pub const PUBLICATION: &str = "entrega_outbox";

/// The prefix of the heartbeat messages written to the WAL ([`emit_heartbeat`]).
pub const HEARTBEAT_PREFIX: &str = "entrega.heartbeat";

/// A replication slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    /// Its output plugin (`pgoutput` for a slot a WAL relay can read).
    pub plugin: Option<String>,
    /// The database it decodes.
    pub database: Option<String>,
    /// Whether a session streams from it now.
    pub active: bool,
    /// That session's process id.
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved` or `lost` (PostgreSQL 13+).
    pub wal_status: Option<String>,
    /// WAL the slot keeps from being removed, in bytes.
    pub retained_bytes: Option<i64>,
    /// WAL written since the position its reader confirmed, in bytes.
    pub lag_bytes: Option<i64>,
    /// WAL that can still be written before the slot is invalidated, in bytes (`NULL` when
    /// `max_slot_wal_keep_size` is unlimited).
    pub safe_wal_bytes: Option<i64>,
}

impl SlotState {
    /// Whether PostgreSQL invalidated the slot (its WAL was removed).
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }
}

/// The server's `wal_level` (`logical` is what a WAL relay needs).
pub async fn wal_level(pool: &PgPool) -> Result<String, StoreError> {
    sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(pool)
        .await
        .map_err(classify)
}

/// The slot `name`, or `None` when the server has no such slot.
pub async fn slot_state(pool: &PgPool, name: &str) -> Result<Option<SlotState>, StoreError> {
    type Row = (
        Option<String>,
        Option<String>,
        bool,
        Option<i32>,
        Option<String>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
    );
    let row: Option<Row> = sqlx::query_as(
        "SELECT plugin::text, database::text, active, active_pid, wal_status, \
                pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, \
                pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, \
                safe_wal_size \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(name)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(row.map(|r| SlotState {
        plugin: r.0,
        database: r.1,
        active: r.2,
        active_pid: r.3,
        wal_status: r.4,
        retained_bytes: r.5,
        lag_bytes: r.6,
        safe_wal_bytes: r.7,
    }))
}

/// Whether the publication exists, publishes inserts and includes the `outbox` table of the
/// current schema: `Ok(None)` when it does not exist, `Ok(Some(why))` when it is not usable.
pub async fn publication_problem(pool: &PgPool) -> Result<Option<Option<String>>, StoreError> {
    let row: Option<(bool, bool)> = sqlx::query_as(
        "SELECT p.pubinsert, EXISTS (SELECT 1 FROM pg_publication_tables t \
                 WHERE t.pubname = p.pubname AND t.tablename = 'outbox' \
                   AND t.schemaname = current_schema()) \
         FROM pg_publication p WHERE p.pubname = $1",
    )
    .bind(PUBLICATION)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(match row {
        None => None,
        Some((true, true)) => Some(None),
        Some((false, _)) => Some(Some(format!(
            "publication {PUBLICATION} does not publish inserts"
        ))),
        Some((_, false)) => Some(Some(format!(
            "publication {PUBLICATION} does not include the outbox table"
        ))),
    })
}

/// Creates the publication of the outbox's inserts unless it exists (the outbox migration
/// creates it too; this covers a table adopted by an older migration).
pub async fn ensure_publication(pool: &PgPool) -> Result<(), StoreError> {
    match publication_problem(pool).await? {
        Some(None) => Ok(()),
        Some(Some(why)) => Err(StoreError::rejected(why)),
        None => {
            let created = sqlx::query(&format!(
                "CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox WITH (publish = 'insert')"
            ))
            .execute(pool)
            .await;
            match created {
                Ok(_) => Ok(()),
                // Created at the same moment by another relay.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42710") => Ok(()),
                Err(e) => Err(classify(e)),
            }
        }
    }
}

/// What entrega recorded about slot `name`: `None` when it never created it, else whether
/// the rows committed before the slot were published (the catch-up finished).
pub async fn slot_record(pool: &PgPool, name: &str) -> Result<Option<bool>, StoreError> {
    sqlx::query_scalar("SELECT caught_up_at IS NOT NULL FROM entrega_wal_slots WHERE slot = $1")
        .bind(name)
        .fetch_optional(pool)
        .await
        .map_err(classify)
}

/// The server's current timeline, read from the name of the WAL segment being written (its
/// first eight hex digits): 1 on a server never promoted, one more at each promotion.
const TIMELINE: &str =
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint";

/// Whether slot `name`, recorded and missing from the server, was left behind by a failover:
/// it was created on an earlier timeline than the server's (a standby promoted since).
/// `false` when it was created on this timeline (someone dropped it) or before timelines
/// were recorded.
pub async fn left_behind_by_failover(pool: &PgPool, name: &str) -> Result<bool, StoreError> {
    let found: Option<(Option<i64>, i64)> = sqlx::query_as(&format!(
        "SELECT timeline, {TIMELINE} FROM entrega_wal_slots WHERE slot = $1"
    ))
    .bind(name)
    .fetch_optional(pool)
    .await
    .map_err(classify)?;
    Ok(matches!(found, Some((Some(created), now)) if now > created))
}

/// Records that slot `name` is being created (its catch-up not yet done); returns this
/// creation's generation, which [`record_caught_up`] names.
pub async fn record_slot_creation(pool: &PgPool, name: &str) -> Result<String, StoreError> {
    sqlx::query_scalar(&format!(
        "INSERT INTO entrega_wal_slots (slot, timeline) VALUES ($1, {TIMELINE}) \
         ON CONFLICT (slot) DO UPDATE SET created_at = clock_timestamp(), caught_up_at = NULL, \
         timeline = EXCLUDED.timeline \
         RETURNING created_at::text"
    ))
    .bind(name)
    .fetch_one(pool)
    .await
    .map_err(classify)
}

/// Records that every row committed before slot `name` was published, if the recorded
/// creation is still `generation`; `false` when another creation replaced it.
pub async fn record_caught_up(
    pool: &PgPool,
    name: &str,
    generation: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE entrega_wal_slots SET caught_up_at = now() \
         WHERE slot = $1 AND created_at::text = $2",
    )
    .bind(name)
    .bind(generation)
    .execute(pool)
    .await
    .map_err(classify)?;
    Ok(done.rows_affected() == 1)
}

/// Forgets slot `name` (an operator's deliberate reset) and drops it if it still exists and
/// nobody streams from it.
pub async fn forget_slot(pool: &PgPool, name: &str) -> Result<(), StoreError> {
    sqlx::query(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = $1 AND NOT active",
    )
    .bind(name)
    .execute(pool)
    .await
    .map_err(classify)?;
    sqlx::query("DELETE FROM entrega_wal_slots WHERE slot = $1")
        .bind(name)
        .execute(pool)
        .await
        .map_err(classify)?;
    Ok(())
}

/// Writes a heartbeat message to the WAL (not transactional: it is decoded at once), so a
/// slot whose outbox is idle still sees its position move and releases WAL the rest of the
/// database writes.
pub async fn emit_heartbeat(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_logical_emit_message(false, $1, '')")
        .bind(HEARTBEAT_PREFIX)
        .execute(pool)
        .await
        .map_err(classify)?;
    Ok(())
}

/// The default slot name of the database behind `pool`: `entrega_outbox_` and the database's
/// name, lowercased, with every character but letters, digits and `_` replaced by `_`, cut to
/// PostgreSQL's 63 bytes. Slot names are server-wide, so each database gets its own.
pub async fn default_slot_name(pool: &PgPool) -> Result<String, StoreError> {
    let database: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(pool)
        .await
        .map_err(classify)?;
    Ok(slot_name_for(&database))
}

/// [`default_slot_name`] of a database named `database`.
pub fn slot_name_for(database: &str) -> String {
    let mut name: String = format!("entrega_outbox_{database}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    name.truncate(63);
    name
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_are_valid_for_any_database_name() {
        assert_eq!(slot_name_for("km0-Pedidos"), "entrega_outbox_km0_pedidos");
        assert_eq!(slot_name_for(&"x".repeat(100)).len(), 63);
    }
}
