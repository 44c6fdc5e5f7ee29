//! Purging, status, releasing held rows and inspecting rows of the in-memory outbox.

use async_trait::async_trait;
use entrega_core::{
    BlockedRow, OutboxMaintenance, OutboxStatus, ReleaseError, StoreError, BLOCKED_ROWS_LISTED,
};
use uuid::Uuid;

use super::outbox::MemoryOutbox;

/// Inspection for tests, without going through the traits.
impl MemoryOutbox {
    /// Lane, sequence and published flag of a row.
    pub fn row_state(&self, id: Uuid) -> Option<(u32, i64, bool)> {
        let state = self.state();
        state
            .rows
            .iter()
            .find(|r| r.row.id == id)
            .map(|r| (r.lane, r.row.seq, r.published_at_ms.is_some()))
    }

    /// Number of rows, published or not.
    pub fn len(&self) -> usize {
        self.state().rows.len()
    }

    /// Whether the outbox holds no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ids of rows not yet published.
    pub fn pending_ids(&self) -> Vec<Uuid> {
        let state = self.state();
        state
            .rows
            .iter()
            .filter(|r| r.published_at_ms.is_none())
            .map(|r| r.row.id)
            .collect()
    }
}

#[async_trait]
impl OutboxMaintenance for MemoryOutbox {
    async fn purge_published(&self, before_ms: i64) -> Result<u64, StoreError> {
        let mut state = self.state();
        let before = state.rows.len();
        state
            .rows
            .retain(|r| r.published_at_ms.is_none_or(|at| at >= before_ms));
        Ok((before - state.rows.len()) as u64)
    }

    async fn status(&self, now_ms: i64) -> Result<OutboxStatus, StoreError> {
        let state = self.state();
        let pending = state.rows.iter().filter(|r| r.published_at_ms.is_none());
        let oldest = pending.clone().map(|r| r.row.created_at_ms).min();
        let refused = state.rows.iter().filter(|r| r.refused());
        let held = refused.clone().filter(|r| r.held_at_ms.is_some()).count() as u64;
        Ok(OutboxStatus {
            pending: pending.count() as u64,
            oldest_pending_age_ms: oldest.map_or(0, |at| (now_ms - at).max(0)),
            published: state
                .rows
                .iter()
                .filter(|r| r.published_at_ms.is_some())
                .count() as u64,
            retrying: refused.clone().count() as u64 - held,
            held,
            blocked: refused
                .take(BLOCKED_ROWS_LISTED)
                .map(|r| BlockedRow {
                    id: r.row.id,
                    aggregate: r.row.aggregate.clone(),
                    aggregate_id: r.row.aggregate_id.clone(),
                    kind: r.row.kind.clone(),
                    attempts: r.row.attempts,
                    next_attempt_ms: r.next_attempt_ms,
                    last_error: r.last_error.clone(),
                    held_at_ms: r.held_at_ms,
                })
                .collect(),
        })
    }

    async fn release(&self, id: Uuid) -> Result<(), ReleaseError> {
        let mut state = self.state();
        let row = state
            .rows
            .iter_mut()
            .find(|r| r.row.id == id)
            .ok_or(ReleaseError::UnknownRow { id })?;
        if row.published_at_ms.is_some() || row.held_at_ms.is_none() {
            return Err(ReleaseError::NotHeld { id });
        }
        row.held_at_ms = None;
        row.next_attempt_ms = None;
        Ok(())
    }
}
