//! An outbox reader that counts the time spent reading pending rows and marking them, so a
//! relay bench can say which of a round's legs (publish, read, mark) holds it up.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use entrega_core::{
    LaneCursor, LaneLease, LaneMark, LaneRows, OutboxReader, OutboxRow, Refusal, StoreError,
};
use uuid::Uuid;

/// Microseconds spent in the reader's statements, summed over calls.
#[derive(Debug, Default)]
pub(crate) struct ReaderTimes {
    /// Reading pending rows.
    pub(crate) read_us: AtomicU64,
    /// Marking rows published (and recording refusals).
    pub(crate) mark_us: AtomicU64,
}

/// Wraps a reader; every call is timed into the shared [`ReaderTimes`].
pub(crate) struct TimedReader {
    inner: Arc<dyn OutboxReader>,
    times: Arc<ReaderTimes>,
}

impl TimedReader {
    /// `inner`, timed into `times`.
    pub(crate) fn new(inner: Arc<dyn OutboxReader>, times: Arc<ReaderTimes>) -> Self {
        Self { inner, times }
    }
}

/// Awaits `f`, adding its duration to `total` (microseconds).
pub(crate) async fn timed<T>(total: &AtomicU64, f: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = f.await;
    let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    total.fetch_add(us, Ordering::Relaxed);
    out
}

#[async_trait]
impl OutboxReader for TimedReader {
    async fn pending(&self, lane: u32, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        timed(&self.times.read_us, self.inner.pending(lane, limit)).await
    }

    async fn mark_published(
        &self,
        lease: &LaneLease,
        ids: &[Uuid],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mark = self.inner.mark_published(lease, ids, now_ms);
        timed(&self.times.mark_us, mark).await
    }

    async fn record_refusal(
        &self,
        lease: &LaneLease,
        refusal: &Refusal,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let record = self.inner.record_refusal(lease, refusal, now_ms);
        timed(&self.times.mark_us, record).await
    }

    async fn pending_lanes(
        &self,
        lanes: &[u32],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        timed(&self.times.read_us, self.inner.pending_lanes(lanes, limit)).await
    }

    async fn pending_lanes_after(
        &self,
        cursors: &[LaneCursor],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        let read = self.inner.pending_lanes_after(cursors, limit);
        timed(&self.times.read_us, read).await
    }

    async fn mark_published_lanes(
        &self,
        marks: &[LaneMark],
        now_ms: i64,
    ) -> Result<Vec<u32>, StoreError> {
        let mark = self.inner.mark_published_lanes(marks, now_ms);
        timed(&self.times.mark_us, mark).await
    }
}
