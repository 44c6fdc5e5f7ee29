//! A publisher that counts the time spent waiting for the broker's confirmations, so a relay
//! bench can say how much of a drain went to the broker and how much to the outbox's SQL.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use async_trait::async_trait;
use entrega_core::{OutgoingMessage, Publisher, TransportError};

use super::timed_reader::timed;

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
        timed(&self.busy_us, self.inner.publish(batch)).await
    }
}
