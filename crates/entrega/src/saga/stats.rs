//! Counters of what an orchestrator's sagas did, for the demo's report and for alerts (a
//! saga waiting for an operator is one).

use std::sync::atomic::{AtomicU64, Ordering};

use super::flow::Ending;

/// What the sagas of one [`Sagas`](super::Sagas) value did since it was made.
#[derive(Debug, Default)]
pub struct SagaStats {
    started: AtomicU64,
    completed: AtomicU64,
    compensated: AtomicU64,
    needs_operator: AtomicU64,
    duplicates: AtomicU64,
    ignored: AtomicU64,
}

/// A snapshot of [`SagaStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SagaStatsSnapshot {
    /// Sagas started.
    pub started: u64,
    /// Sagas that completed.
    pub completed: u64,
    /// Sagas that finished compensating.
    pub compensated: u64,
    /// Times a saga was handed to an operator (a compensation failed past its limit).
    pub needs_operator: u64,
    /// Reply events seen before (their inbox key recorded).
    pub duplicates: u64,
    /// Replies late, repeated or under another key.
    pub ignored: u64,
}

impl SagaStats {
    /// Current figures.
    pub fn snapshot(&self) -> SagaStatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SagaStatsSnapshot {
            started: get(&self.started),
            completed: get(&self.completed),
            compensated: get(&self.compensated),
            needs_operator: get(&self.needs_operator),
            duplicates: get(&self.duplicates),
            ignored: get(&self.ignored),
        }
    }

    pub(crate) fn started(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn ended(&self, ending: &Ending, kind: &str, id: &str) {
        let counter = match ending {
            Ending::Completed => &self.completed,
            Ending::Compensated { reason } => {
                tracing::info!(saga = %id, %kind, %reason, "saga compensated");
                &self.compensated
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn needs_operator(&self) {
        self.needs_operator.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn ignored(&self) {
        self.ignored.fetch_add(1, Ordering::Relaxed);
    }
}
