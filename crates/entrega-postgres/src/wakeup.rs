//! One `LISTEN` connection per handle, shared by its clones, fanned out to in-process waiters.
//!
//! Waiters hold a `watch` receiver per key (a topic, or `""` for the outbox); every
//! notification bumps the key's counter. Notifications are lost while the connection is
//! down, so every (re)connection bumps every key: waiters wake and look at the tables again.
//! While the listener is down waiters fall back to their own timeouts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::watch;

/// Channel the outbox trigger notifies after every inserting statement.
pub const OUTBOX_CHANNEL: &str = "entrega_outbox";

/// Backoff bounds between failed connection attempts.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A lazily started `LISTEN` on one channel, shared by its clones and fanned out to waiters
/// per key (the notification's payload).
#[derive(Clone, Debug)]
pub struct Listener {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    channel: &'static str,
    shared: Arc<Shared>,
    /// Present once the task runs. The task stops when this sender is dropped, i.e. when the
    /// last handle goes away.
    stop: Mutex<Option<watch::Sender<()>>>,
}

#[derive(Debug, Default)]
struct Shared {
    keys: Mutex<HashMap<String, watch::Sender<u64>>>,
    healthy: AtomicBool,
}

impl Shared {
    fn bump(&self, key: &str) {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = keys.get(key) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn bump_all(&self) {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        for tx in keys.values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl Listener {
    /// A listener on `channel`; nothing connects until [`Listener::start`].
    pub fn new(pool: PgPool, channel: &'static str) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                channel,
                shared: Arc::new(Shared::default()),
                stop: Mutex::new(None),
            }),
        }
    }

    /// A receiver whose value changes whenever `key` is notified (or the connection is
    /// re-established). The current value counts as seen.
    pub fn subscribe(&self, key: &str) -> watch::Receiver<u64> {
        let mut keys = self
            .inner
            .shared
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        keys.entry(key.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Starts the background connection unless it runs already. Needs a tokio runtime; outside
    /// one it does nothing and waiters rely on their timeouts.
    pub fn start(&self) {
        let mut stop = self
            .inner
            .stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if stop.is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tx, rx) = watch::channel(());
        runtime.spawn(run(
            self.inner.pool.clone(),
            self.inner.channel,
            Arc::clone(&self.inner.shared),
            rx,
        ));
        *stop = Some(tx);
    }

    /// Waits until `rx` changes or `timeout` passes; while the listener is down, waits at
    /// most `fallback`. Returns whether a change was seen.
    pub async fn wait(
        &self,
        rx: &mut watch::Receiver<u64>,
        timeout: Duration,
        fallback: Duration,
    ) -> bool {
        self.start();
        // While notifications are not being received, the fallback bounds the wait.
        let limit = if self.inner.shared.healthy.load(Ordering::Acquire) {
            timeout
        } else {
            timeout.min(fallback)
        };
        matches!(tokio::time::timeout(limit, rx.changed()).await, Ok(Ok(())))
    }
}

async fn run(
    pool: PgPool,
    channel: &'static str,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<()>,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let connected = tokio::select! {
            r = open(&pool, channel) => r,
            _ = stop.changed() => return,
        };
        let mut listener = match connected {
            Ok(l) => l,
            Err(sqlx::Error::PoolClosed) => return,
            Err(e) => {
                tracing::debug!(channel, error = %e, "listener connection failed");
                shared.healthy.store(false, Ordering::Release);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = MIN_BACKOFF;
        shared.healthy.store(true, Ordering::Release);
        // Anything committed before LISTEN took effect was not announced to us.
        shared.bump_all();
        loop {
            let received = tokio::select! {
                r = listener.try_recv() => r,
                _ = stop.changed() => return,
            };
            match received {
                Ok(Some(n)) => shared.bump(n.payload()),
                // The connection dropped and was re-established: notifications may be lost.
                Ok(None) => shared.bump_all(),
                Err(sqlx::Error::PoolClosed) => {
                    shared.healthy.store(false, Ordering::Release);
                    return;
                }
                Err(e) => {
                    tracing::debug!(channel, error = %e, "listener lost");
                    shared.healthy.store(false, Ordering::Release);
                    shared.bump_all();
                    break;
                }
            }
        }
    }
}

async fn open(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}
