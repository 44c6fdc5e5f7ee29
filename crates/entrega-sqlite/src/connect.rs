//! Opening a database the way every entrega component expects it, and write transactions
//! that cannot deadlock.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use entrega_core::StoreError;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use crate::errors::classify;
use crate::wakeup;

/// How long a statement waits for another connection's lock before failing as busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections per pool; SQLite has one writer anyway, the rest serve concurrent readers.
const MAX_CONNECTIONS: u32 = 8;

/// Opens (creating if needed) a SQLite database and returns a pool configured for entrega.
///
/// Accepts `sqlite://path/to/file.db` (relative or, with a third slash, absolute; parent
/// directories and the file are created) and `sqlite::memory:`. Files use the WAL journal,
/// `busy_timeout` 5 s, `synchronous=NORMAL` and foreign keys, so several processes can share
/// one file; temporary storage (statement journals) in memory. Connections carry the hooks that wake in-process relays and log subscribers right
/// after a commit (as the committing connection goes back to the pool); pools built any other
/// way still work, but their commits are only found by polling.
pub async fn connect(url: &str) -> Result<SqlitePool, StoreError> {
    let in_memory = url.contains(":memory:") || url.contains("mode=memory");
    let options = SqliteConnectOptions::from_str(url)
        .map_err(classify)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(BUSY_TIMEOUT)
        .synchronous(SqliteSynchronous::Normal)
        .foreign_keys(true)
        // Statement journals (a multi-row statement inside a transaction keeps one, to undo
        // itself alone) in memory rather than in temporary files written on every batch.
        .pragma("temp_store", "memory");
    if !in_memory {
        if let Some(dir) = options.get_filename().parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(StoreError::rejected)?;
            }
        }
    }
    let signals = wakeup::signals_for(&options);
    let mut pool = SqlitePoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        // Returning a connection past its lifetime skips `after_release`, and with it the
        // commit wake-up; SQLite connections do not need recycling.
        .max_lifetime(None)
        // A connection to a local file does not go stale: no ping (one more round trip to
        // the connection's thread) before each use.
        .test_before_acquire(false)
        .after_connect({
            let signals = Arc::clone(&signals);
            move |conn, _meta| {
                let signals = Arc::clone(&signals);
                Box::pin(async move { wakeup::install_hooks(conn, signals).await })
            }
        })
        .after_release(move |conn, _meta| {
            let signals = Arc::clone(&signals);
            Box::pin(async move { wakeup::after_release(conn, &signals).await })
        });
    if in_memory {
        // A shared in-memory database lives only while a connection is open.
        pool = pool.min_connections(1).idle_timeout(None);
    }
    pool.connect_with(options).await.map_err(classify)
}

/// Begins a write transaction with `BEGIN IMMEDIATE`.
///
/// A plain `BEGIN` starts as a reader and upgrades on its first write; when another process
/// committed in between, the upgrade fails at once with `SQLITE_BUSY_SNAPSHOT` instead of
/// waiting. Taking the write lock up front makes writers queue on `busy_timeout` instead.
/// Use it for any transaction that writes, e.g. one that claims an inbox key and applies the
/// effect. Dropping the transaction without committing rolls it back.
pub async fn begin_immediate(
    pool: &SqlitePool,
) -> Result<Transaction<'static, Sqlite>, StoreError> {
    pool.begin_with("BEGIN IMMEDIATE").await.map_err(classify)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use sqlx::sqlite::SqliteTransactionManager;
    use sqlx::{Connection, TransactionManager};

    use super::*;

    /// A begin cancelled between SQLite's `BEGIN` and sqlx's `Transaction` leaves its
    /// connection inside a transaction with nothing to roll it back; the pool must not hand
    /// it out like that.
    #[tokio::test]
    async fn a_connection_returned_inside_an_abandoned_begin_is_rolled_back() {
        let dir = std::env::temp_dir().join(format!("entrega-sqlite-{}", uuid::Uuid::new_v4()));
        let url = format!("sqlite://{}", dir.join("db.sqlite").display());
        let pool = connect(&url).await.unwrap();
        sqlx::query("CREATE TABLE t (v INTEGER)")
            .execute(&pool)
            .await
            .unwrap();
        {
            let mut conn = pool.acquire().await.unwrap();
            SqliteTransactionManager::begin(&mut conn, Some("BEGIN IMMEDIATE".into()))
                .await
                .unwrap();
            sqlx::query("INSERT INTO t VALUES (1)")
                .execute(&mut *conn)
                .await
                .unwrap();
            assert!(conn.is_in_transaction());
        }
        // Every connection of the pool begins a write transaction in turn (one at a time:
        // SQLite has one writer), the abandoned one included.
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            held.push(pool.acquire().await.unwrap());
        }
        for conn in &mut held {
            assert!(!conn.is_in_transaction());
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
            sqlx::query("INSERT INTO t VALUES (2)")
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
        drop(held);
        // The abandoned write never happened.
        let ones: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE v = 1")
            .fetch_one(&pool)
            .await
            .unwrap();
        let twos: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE v = 2")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!((ones, twos), (0, i64::from(MAX_CONNECTIONS)));
        pool.close().await;
        std::fs::remove_dir_all(dir).unwrap();
    }
}
