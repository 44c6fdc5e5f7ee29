//! Counters of a worker.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a worker did with the messages it received, shared through an `Arc`.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Messages a handler applied successfully (offset advanced).
    pub acked: AtomicU64,
    /// Messages set aside in the dead-letter topic (offset advanced).
    pub dead_lettered: AtomicU64,
    /// Dead letters the broker refused, held in the consumer's database instead (also
    /// counted in `dead_lettered`).
    pub held: AtomicU64,
    /// Transient failures that were scheduled for another attempt (any strategy).
    pub retried: AtomicU64,
    /// Messages sent to the retry topic or the delay queues
    /// ([`crate::RetryStrategy::RetryTopic`], [`crate::RetryStrategy::DelayQueues`]).
    pub deferred: AtomicU64,
    /// Records written to the parking store: failed heads and the records parked behind
    /// them ([`crate::RetryStrategy::Ordered`]).
    pub parked: AtomicU64,
    /// Messages of a type the router ignores (offset advanced, no handler run).
    pub ignored: AtomicU64,
    /// Offset commits that failed (the offsets are committed again later).
    pub commit_errors: AtomicU64,
    /// Messages delivered again after their partition was rewound to an earlier unfinished
    /// message of another key, whose outcome was already final: not handled again, and not
    /// counted again as acked, ignored or dead-lettered.
    pub skipped: AtomicU64,
    /// Handler calls running right now (a gauge).
    pub in_flight: AtomicU64,
    /// The most handler calls seen running at once; at most `key_concurrency`.
    pub max_in_flight: AtomicU64,
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

    /// Dead letters held in the consumer's database so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Retries scheduled so far.
    pub fn retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }

    /// Messages sent to the retry topic so far.
    pub fn deferred(&self) -> u64 {
        self.deferred.load(Ordering::Relaxed)
    }

    /// Records parked so far.
    pub fn parked(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
    }

    /// Messages ignored so far.
    pub fn ignored(&self) -> u64 {
        self.ignored.load(Ordering::Relaxed)
    }

    /// Redelivered messages skipped because their outcome was already final.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// The most handler calls seen running at once.
    pub fn max_in_flight(&self) -> u64 {
        self.max_in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a handler call as running until the guard is dropped (also when the call is
    /// cancelled).
    pub(crate) fn enter(&self) -> InFlight<'_> {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.max_in_flight.fetch_max(now, Ordering::Relaxed);
        InFlight(self)
    }
}

/// A running handler call; see [`WorkerStats::enter`].
pub(crate) struct InFlight<'a>(&'a WorkerStats);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
