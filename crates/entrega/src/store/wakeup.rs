//! Waking the relay (and the log's subscribers) right after a commit, each backend its own
//! way: SQLite from its connection hooks (commits of this process; others are polled for),
//! PostgreSQL from `LISTEN`/`NOTIFY` (every writer, the seed's own SQL included).

use std::time::Duration;

use entrega_postgres::Listener;
use entrega_sqlite::{CommitWaiter, Watched};
use tokio::sync::{watch, Mutex};

use crate::db::{Db, Pool};

/// A wait for the next commit to the outbox; each handle keeps its own position.
#[derive(Debug)]
pub(crate) enum Waiter {
    /// SQLite's commit hooks.
    Sqlite(CommitWaiter),
    /// PostgreSQL's notifications on a channel, for one key.
    Postgres {
        listener: Listener,
        /// Remembers the last notification seen by this handle, so a commit signalled
        /// between two waits still ends the next one.
        seen: Mutex<watch::Receiver<u64>>,
    },
}

impl Clone for Waiter {
    fn clone(&self) -> Self {
        match self {
            Self::Sqlite(waiter) => Self::Sqlite(waiter.clone()),
            Self::Postgres { listener, .. } => Self::Postgres {
                listener: listener.clone(),
                seen: Mutex::new(listener.subscribe("")),
            },
        }
    }
}

impl Waiter {
    /// Commits to `db`'s outbox.
    pub(crate) fn outbox(db: &Db) -> Self {
        match &db.pool {
            Pool::Sqlite(pool) => Self::Sqlite(CommitWaiter::new(pool, Watched::Outbox)),
            Pool::Postgres(pool) => {
                let listener = Listener::new(pool.clone(), entrega_postgres::OUTBOX_CHANNEL);
                let seen = Mutex::new(listener.subscribe(""));
                Self::Postgres { listener, seen }
            }
        }
    }

    /// Waits for a commit this handle has not seen, or `timeout`.
    pub(crate) async fn wait(&self, timeout: Duration) {
        match self {
            Self::Sqlite(waiter) => {
                waiter.wait(timeout).await;
            }
            Self::Postgres { listener, seen } => {
                let deadline = tokio::time::Instant::now() + timeout;
                let Ok(mut seen) = tokio::time::timeout_at(deadline, seen.lock()).await else {
                    return;
                };
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                // Without a listener there is nothing to wait for but the timeout itself.
                if !listener.wait(&mut seen, left, left).await {
                    tokio::time::sleep_until(deadline).await;
                }
            }
        }
    }
}
