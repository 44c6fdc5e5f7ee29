//! Following a failover: a pool on a URL naming several servers opens its connections on
//! one of them, and a task watches it. When that server stops answering, or stops taking the
//! sessions wanted (a primary demoted to standby), the task finds the one that does, in the
//! URL's order, and points the pool's new connections there; connections opened before the
//! move are closed instead of being handed out again.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnection, PgPool};
use sqlx::Connection;

use crate::connect::with_session_defaults;
use crate::hosts::{accepts, Hosts};

/// How often the server in use is asked whether it still takes the pool's sessions.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How often the servers are asked again while none takes the pool's sessions: a standby is
/// promoted at an instant nobody here knows, and every write waits until it is found.
const SEARCH_EVERY: Duration = Duration::from_millis(100);
/// Longest wait for a server's answer, to that question or to a new connection.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// When the pool last moved to another server.
#[derive(Debug, Clone, Default)]
pub(crate) struct Moved(Arc<Mutex<Option<Instant>>>);

impl Moved {
    fn now(&self) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
    }

    /// Whether a connection `age` old was opened before the last move.
    pub fn before(&self, age: Duration) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|at| age > at.elapsed())
    }
}

/// Watches the server `pool` uses (`current` of `hosts`, reached through `monitor`) until the
/// pool is closed, moving the pool when that server is lost.
pub(crate) async fn watch(
    pool: PgPool,
    hosts: Hosts,
    mut current: usize,
    mut monitor: PgConnection,
    moved: Moved,
) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        if pool.is_closed() {
            let _ = monitor.close().await;
            return;
        }
        let answer = tokio::time::timeout(PROBE_TIMEOUT, accepts(&mut monitor, hosts.attrs)).await;
        if matches!(answer, Ok(Ok(true))) {
            continue;
        }
        tracing::warn!(
            server = %hosts.hosts[current].name,
            wanted = hosts.attrs.as_str(),
            "PostgreSQL server lost or no longer takes the sessions wanted; looking among {}",
            hosts.names()
        );
        loop {
            if pool.is_closed() {
                return;
            }
            match hosts.find(PROBE_TIMEOUT).await {
                Ok((found, conn)) => {
                    monitor = conn;
                    if found == current {
                        tracing::info!(server = %hosts.hosts[current].name, "PostgreSQL server back");
                    } else {
                        pool.set_connect_options(with_session_defaults(
                            hosts.hosts[found].options.clone(),
                        ));
                        moved.now();
                        tracing::warn!(
                            from = %hosts.hosts[current].name,
                            to = %hosts.hosts[found].name,
                            "PostgreSQL sessions moved to another server"
                        );
                        current = found;
                    }
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "no PostgreSQL server takes the sessions yet");
                    tokio::time::sleep(SEARCH_EVERY).await;
                }
            }
        }
    }
}
