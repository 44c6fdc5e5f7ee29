//! Operator state and audit of dead letters in memory, for the dead-letter tooling's tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use entrega_core::{DeadLetterId, DeadLetterMark, DlqAuditEntry, DlqStore, StoreError};

#[derive(Debug, Default)]
struct State {
    marks: BTreeMap<DeadLetterId, DeadLetterMark>,
    audit: Vec<DlqAuditEntry>,
    /// The action lock: its holder and when its lease ends.
    acting: Option<(String, i64)>,
}

/// A [`DlqStore`] in memory. Cheap to clone; clones share the same state.
#[derive(Debug, Clone, Default)]
pub struct MemoryDlqStore {
    state: Arc<Mutex<State>>,
}

impl MemoryDlqStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a test thread panicked; the data is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every audit entry, oldest first.
    pub fn entries(&self) -> Vec<DlqAuditEntry> {
        self.state().audit.clone()
    }
}

#[async_trait]
impl DlqStore for MemoryDlqStore {
    async fn marks(&self, dlq_topic: &str) -> Result<Vec<DeadLetterMark>, StoreError> {
        // Ids order by topic, then partition, then offset: the order the trait promises.
        Ok(self
            .state()
            .marks
            .values()
            .filter(|m| m.id.topic == dlq_topic)
            .cloned()
            .collect())
    }

    async fn record(
        &self,
        entry: &DlqAuditEntry,
        marks: &[DeadLetterMark],
    ) -> Result<(), StoreError> {
        let mut state = self.state();
        for mark in marks {
            state.marks.insert(mark.id.clone(), mark.clone());
        }
        state.audit.push(entry.clone());
        Ok(())
    }

    async fn lock_actions(
        &self,
        holder: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<bool, StoreError> {
        let mut state = self.state();
        let free = match &state.acting {
            Some((current, until)) => current == holder || *until < now_ms,
            None => true,
        };
        if free {
            state.acting = Some((holder.to_owned(), expires_at_ms));
        }
        Ok(free)
    }

    async fn unlock_actions(&self, holder: &str) -> Result<(), StoreError> {
        let mut state = self.state();
        if state.acting.as_ref().is_some_and(|(h, _)| h == holder) {
            state.acting = None;
        }
        Ok(())
    }

    async fn audit(&self, limit: usize) -> Result<Vec<DlqAuditEntry>, StoreError> {
        Ok(self
            .state()
            .audit
            .iter()
            .rev()
            .take(limit)
            .cloned()
            .collect())
    }
}
