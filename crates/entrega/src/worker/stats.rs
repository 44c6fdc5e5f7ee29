//! Counters of a worker.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a worker did with the messages it received, shared through an `Arc`.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Messages a handler applied successfully (offset advanced).
    pub acked: AtomicU64,
    /// Messages set aside in the dead-letter topic (offset advanced).
    pub dead_lettered: AtomicU64,
    /// Transient failures that were scheduled for another attempt.
    pub retried: AtomicU64,
    /// Messages of a type the router ignores (offset advanced, no handler run).
    pub ignored: AtomicU64,
    /// Offset commits that failed (the offsets are committed again later).
    pub commit_errors: AtomicU64,
}

impl WorkerStats {
    /// Messages applied so far.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Messages dead-lettered so far.
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::Relaxed)
    }

    /// Retries scheduled so far.
    pub fn retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }

    /// Messages ignored so far.
    pub fn ignored(&self) -> u64 {
        self.ignored.load(Ordering::Relaxed)
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
