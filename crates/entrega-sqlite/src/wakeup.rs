//! In-process wake-ups after commits.
//!
//! SQLite has no LISTEN/NOTIFY, so a relay or a log subscriber in the same process is woken
//! from the connection hooks instead. Every connection of a pool built by [`crate::connect`]
//! carries three hooks: the update hook notes which watched tables a transaction touched, the
//! rollback hook forgets it, and the commit hook records the touched tables against the
//! connection. The pool's `after_release` callback then fires the matching signals. Firing on
//! release rather than inside the commit hook matters: the commit hook runs *before* SQLite
//! writes the commit, so a reader woken from it could look before the rows are visible and then
//! sleep through them. Writes from other processes are found by each waiter's polling fallback.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::sqlite::SqliteTransactionManager;
use sqlx::{Connection, SqliteConnection, TransactionManager};
use tokio::sync::Notify;

/// A wake-up that waiters cannot miss: every firing bumps a generation, and a waiter returns
/// as soon as the generation differs from the one it last saw.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    generation: AtomicU64,
    notify: Notify,
}

impl Signal {
    /// Wakes every waiter, and any later waiter that has not seen this generation yet.
    pub(crate) fn fire(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// The current generation.
    pub(crate) fn current(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Waits until the generation moves past `seen` or `timeout` passes; returns the
    /// generation at return.
    pub(crate) async fn wait_past(&self, seen: u64, timeout: Duration) -> u64 {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        // Registered before reading the generation, so a firing between the read and the
        // await still wakes us.
        notified.as_mut().enable();
        let now = self.current();
        if now != seen {
            return now;
        }
        let _ = tokio::time::timeout(timeout, notified).await;
        self.current()
    }
}

/// The table whose commits a [`CommitWaiter`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// `outbox`: the relay waits for new rows.
    Outbox,
    /// `entrega_log`: the log transport's subscribers wait for appended records.
    Log,
}

/// Every watched table, in the order [`Watched`] declares them (its index is `watched as usize`); a transaction's changes are noted as bit `1 << index`.
const WATCHED: [(Watched, &str); 2] = [(Watched::Outbox, "outbox"), (Watched::Log, "entrega_log")];

/// Waits for commits to one table of a database, made through any pool of this process on
/// the same file. Each handle keeps its own position, so a commit signalled between two waits
/// still ends the next one; a clone starts from its original's position.
#[derive(Debug)]
pub struct CommitWaiter {
    signals: Arc<DbSignals>,
    watched: Watched,
    seen: AtomicU64,
}

impl Clone for CommitWaiter {
    fn clone(&self) -> Self {
        Self {
            signals: Arc::clone(&self.signals),
            watched: self.watched,
            seen: AtomicU64::new(self.seen.load(Ordering::SeqCst)),
        }
    }
}

impl CommitWaiter {
    /// A waiter for commits to `watched` in the database of `pool`; commits before now count
    /// as seen.
    pub fn new(pool: &sqlx::SqlitePool, watched: Watched) -> Self {
        let signals = signals_for(&pool.connect_options());
        let seen = AtomicU64::new(Self::signal_of(&signals, watched).current());
        Self {
            signals,
            watched,
            seen,
        }
    }

    fn signal_of(signals: &DbSignals, watched: Watched) -> &Signal {
        &signals.signals[watched as usize]
    }

    /// Counts every commit signalled so far as seen: call it before reading the table, so a
    /// commit landing after the read still ends the next [`wait`](Self::wait).
    pub fn mark(&self) {
        let now = Self::signal_of(&self.signals, self.watched).current();
        self.seen.store(now, Ordering::SeqCst);
    }

    /// Wakes every waiter on this handle's table and database now (pools built by
    /// [`crate::connect`] do so on their own after each commit). Cheap: keep a handle
    /// rather than making one per signal, which looks the database file up.
    pub fn fire(&self) {
        Self::signal_of(&self.signals, self.watched).fire();
    }

    /// Waits until a commit this handle has not seen yet, or `timeout`; returns whether one
    /// came. Commits from other processes are not signalled: callers poll as well.
    pub async fn wait(&self, timeout: Duration) -> bool {
        let seen = self.seen.load(Ordering::SeqCst);
        let now = Self::signal_of(&self.signals, self.watched)
            .wait_past(seen, timeout)
            .await;
        self.seen.store(now, Ordering::SeqCst);
        now != seen
    }
}

/// The signals of one database file, shared by every pool and handle on it in this process.
#[derive(Debug, Default)]
pub(crate) struct DbSignals {
    /// Commits to each table of [`WATCHED`], in its order.
    signals: [Signal; WATCHED.len()],
    /// Committed-but-not-yet-signalled table bits, by connection handle address.
    dirty: Mutex<HashMap<usize, u8>>,
}

impl DbSignals {
    fn dirty(&self) -> MutexGuard<'_, HashMap<usize, u8>> {
        // A poisoned map only holds wake-up hints; keep using it.
        self.dirty.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark_committed(&self, connection: usize, bits: u8) {
        *self.dirty().entry(connection).or_default() |= bits;
    }

    fn has_pending(&self) -> bool {
        !self.dirty().is_empty()
    }

    fn fire_committed(&self, connection: usize) {
        let bits = self.dirty().remove(&connection).unwrap_or(0);
        for (i, signal) in self.signals.iter().enumerate() {
            if bits & (1 << i) != 0 {
                signal.fire();
            }
        }
    }
}

fn registry() -> MutexGuard<'static, HashMap<PathBuf, Weak<DbSignals>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<PathBuf, Weak<DbSignals>>>> = OnceLock::new();
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// The registry key of a database: its canonical path, so `./a.db` and `/abs/a.db` meet.
/// In-memory databases have a unique synthetic name already.
fn key_of(filename: &Path) -> PathBuf {
    if let Ok(path) = std::fs::canonicalize(filename) {
        return path;
    }
    // The file may not exist yet: canonicalize the directory and keep the name.
    match (filename.parent(), filename.file_name()) {
        (Some(dir), Some(name)) => {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            std::fs::canonicalize(dir)
                .map(|d| d.join(name))
                .unwrap_or_else(|_| filename.to_path_buf())
        }
        _ => filename.to_path_buf(),
    }
}

/// The signals of the database `options` points at.
pub(crate) fn signals_for(options: &SqliteConnectOptions) -> Arc<DbSignals> {
    let key = key_of(options.get_filename());
    let mut map = registry();
    if let Some(existing) = map.get(&key).and_then(Weak::upgrade) {
        return existing;
    }
    map.retain(|_, weak| weak.strong_count() > 0);
    let signals = Arc::new(DbSignals::default());
    map.insert(key, Arc::downgrade(&signals));
    signals
}

/// Installs the update, rollback and commit hooks on a fresh connection.
pub(crate) async fn install_hooks(
    conn: &mut SqliteConnection,
    signals: Arc<DbSignals>,
) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    // The handle's address identifies the connection in `after_release`, which only gets
    // the connection back.
    let key = handle.as_raw_handle().as_ptr() as usize;
    let touched = Arc::new(AtomicU8::new(0));

    let on_update = Arc::clone(&touched);
    handle.set_update_hook(move |change| {
        if let Some(i) = WATCHED.iter().position(|(_, table)| *table == change.table) {
            on_update.fetch_or(1 << i, Ordering::SeqCst);
        }
    });

    let on_rollback = Arc::clone(&touched);
    handle.set_rollback_hook(move || on_rollback.store(0, Ordering::SeqCst));

    handle.set_commit_hook(move || {
        let bits = touched.swap(0, Ordering::SeqCst);
        if bits != 0 {
            signals.mark_committed(key, bits);
        }
        // Never veto the commit.
        true
    });
    Ok(())
}

/// Fires the signals of commits made on `conn` since it was acquired; the commit is complete
/// by now, so waiters will see the rows.
///
/// A connection can come back still inside a transaction: when a `begin` is cancelled after
/// SQLite began but before sqlx built its `Transaction` (a handler timed out, a poll raced
/// against shutdown), nothing is left to roll it back, and the next `BEGIN IMMEDIATE` on the
/// connection would fail. It is rolled back here, before anyone else gets it.
pub(crate) async fn after_release(
    conn: &mut SqliteConnection,
    signals: &DbSignals,
) -> Result<bool, sqlx::Error> {
    if conn.is_in_transaction() {
        SqliteTransactionManager::rollback(conn).await?;
        if conn.is_in_transaction() {
            // Nested deeper than one abandoned begin: not worth untangling, close it.
            return Ok(false);
        }
    }
    if signals.has_pending() {
        let key = conn.lock_handle().await?.as_raw_handle().as_ptr() as usize;
        signals.fire_committed(key);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_firing_before_the_wait_is_not_missed() {
        let signal = Signal::default();
        let seen = signal.current();
        signal.fire();
        let started = std::time::Instant::now();
        let now = signal.wait_past(seen, Duration::from_secs(5)).await;
        assert_eq!(now, seen + 1);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn without_a_firing_the_wait_times_out() {
        let signal = Signal::default();
        let seen = signal.current();
        assert_eq!(
            signal.wait_past(seen, Duration::from_millis(50)).await,
            seen
        );
    }
}
