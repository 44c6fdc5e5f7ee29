//! A publisher that counts the time spent waiting for the broker's confirmations, so a relay
//! bench can say how much of a drain went to the broker and how much to the outbox's SQL.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use entrega_core::{OutgoingMessage, Publisher, TransportError};

/// Wraps a publisher; clones of the returned totals see every call.
pub(crate) struct TimedPublisher {
    inner: Arc<dyn Publisher>,
    busy_us: Arc<AtomicU64>,
}

impl TimedPublisher {
    /// `inner`, timed into `busy_us` (microseconds, summed over calls).
    pub(crate) fn new(inner: Arc<dyn Publisher>, busy_us: Arc<AtomicU64>) -> Self {
        Self { inner, busy_us }
    }
}

#[async_trait]
impl Publisher for TimedPublisher {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        let started = Instant::now();
        let result = self.inner.publish(batch).await;
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.busy_us.fetch_add(us, Ordering::Relaxed);
        result
    }
}
