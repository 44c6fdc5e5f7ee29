//! The slot as operators watch it: WAL retained, confirmed lag in bytes and seconds, whether
//! it streams and whether PostgreSQL invalidated it. Read every few seconds into gauges
//! (and the metrics of [`crate::metrics`]).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use entrega_postgres::wal::slot;
use tokio_util::sync::CancellationToken;

use super::WalRelay;
use crate::metrics;

/// The slot's state as last read, shared with whoever holds the `Arc` (metrics, tests).
#[derive(Debug, Default)]
pub struct SlotGauges {
    retained_bytes: AtomicI64,
    lag_bytes: AtomicI64,
    oldest_unconfirmed_ms: AtomicI64,
    streaming: AtomicBool,
    lost: AtomicBool,
}

impl SlotGauges {
    /// WAL the slot keeps from removal, in bytes, as last read.
    pub fn retained_bytes(&self) -> i64 {
        self.retained_bytes.load(Ordering::Relaxed)
    }

    /// WAL written past the position the relay confirmed, in bytes, as last read.
    pub fn lag_bytes(&self) -> i64 {
        self.lag_bytes.load(Ordering::Relaxed)
    }

    /// Seconds since the oldest transaction read and not yet confirmed committed; 0 when
    /// everything read is confirmed.
    pub fn lag_seconds(&self) -> f64 {
        match self.oldest_unconfirmed_ms.load(Ordering::Relaxed) {
            0 => 0.0,
            at => (entrega_core::now_ms() - at).max(0) as f64 / 1000.0,
        }
    }

    /// Whether this relay streams from the slot now.
    pub fn streaming(&self) -> bool {
        self.streaming.load(Ordering::Relaxed)
    }

    /// Whether the slot was found invalidated or missing.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    pub(super) fn set_streaming(&self, on: bool) {
        self.streaming.store(on, Ordering::Relaxed);
    }

    pub(super) fn set_oldest_unconfirmed(&self, at_ms: Option<i64>) {
        self.oldest_unconfirmed_ms
            .store(at_ms.unwrap_or(0), Ordering::Relaxed);
    }
}

/// Reads the slot every `check_interval` until `stop`, into the gauges and the metrics.
pub(super) fn spawn_checks(relay: &WalRelay, name: &str, stop: CancellationToken) {
    let pool = relay.pool.clone();
    let gauges = Arc::clone(&relay.gauges);
    let every = relay.wal.check_interval;
    let name = name.to_owned();
    tokio::spawn(async move {
        loop {
            match slot::slot_state(&pool, &name).await {
                Ok(state) => {
                    let lost = state.as_ref().is_none_or(slot::SlotState::is_lost);
                    let retained = state.as_ref().and_then(|s| s.retained_bytes).unwrap_or(0);
                    let lag = state.as_ref().and_then(|s| s.lag_bytes).unwrap_or(0);
                    gauges.retained_bytes.store(retained, Ordering::Relaxed);
                    gauges.lag_bytes.store(lag, Ordering::Relaxed);
                    gauges.lost.store(lost, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(slot = %name, error = %e, "reading the replication slot failed")
                }
            }
            metrics::wal_slot(&name, &gauges);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    });
}
