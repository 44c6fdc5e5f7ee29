//! An outbox in memory, with the same lease and visibility rules as the database backends.
//!
//! Used by the engine's tests and as a reference the conformance suite is checked against.
//! Sequence numbers are allocated when a row is inserted, rows become visible when their
//! transaction commits: exactly the shape that makes a late commit possible on PostgreSQL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    lane_of, plan_balance, Clock, Holder, LaneCursor, LaneLease, LaneLeases, LaneMark, LaneRows,
    NewEvent, OutboxReader, OutboxRow, OutboxWakeup, RawJson, Refusal, SlotLease, StoreError,
    SystemClock, LANES,
};
use tokio::sync::Notify;
use uuid::Uuid;

#[derive(Debug, Clone)]
pub(super) struct StoredRow {
    pub(super) row: OutboxRow,
    pub(super) lane: u32,
    pub(super) published_at_ms: Option<i64>,
    pub(super) next_attempt_ms: Option<i64>,
    pub(super) last_error: Option<String>,
    pub(super) held_at_ms: Option<i64>,
}

impl StoredRow {
    /// Refused and not yet due again (or held), at `now_ms`.
    fn blocks(&self, now_ms: i64) -> bool {
        self.published_at_ms.is_none()
            && (self.held_at_ms.is_some() || self.next_attempt_ms.is_some_and(|t| t > now_ms))
    }

    /// Refused at least once and still pending: what a status lists.
    pub(super) fn refused(&self) -> bool {
        self.published_at_ms.is_none()
            && (self.held_at_ms.is_some() || self.next_attempt_ms.is_some())
    }
}

impl State {
    /// Pending rows of `lane` past `after_seq`, oldest first, leaving out every row of an
    /// aggregate from its earliest blocked row on.
    fn readable(&self, lane: u32, after_seq: i64, now_ms: i64) -> impl Iterator<Item = &StoredRow> {
        let blocked: Vec<&StoredRow> = self
            .rows
            .iter()
            .filter(|r| r.lane == lane && r.blocks(now_ms))
            .collect();
        self.rows.iter().filter(move |r| {
            r.lane == lane
                && r.published_at_ms.is_none()
                && r.row.seq > after_seq
                && !blocked
                    .iter()
                    .any(|b| b.row.aggregate_id == r.row.aggregate_id && b.row.seq <= r.row.seq)
        })
    }

    fn holds(&self, lease: &LaneLease) -> bool {
        self.lanes.iter().any(|l| {
            l.slot == lease.lane
                && l.owner.as_deref() == Some(&lease.owner)
                && l.token == lease.token
        })
    }
}

#[derive(Debug)]
pub(super) struct State {
    next_seq: i64,
    pub(super) rows: Vec<StoredRow>,
    lanes: Vec<SlotLease>,
    instances: HashMap<String, i64>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    commits: Notify,
    clock: Arc<dyn Clock>,
}

/// An in-memory outbox implementing every outbox trait of `entrega-core`. Cheap to clone;
/// clones share the same rows.
#[derive(Debug, Clone)]
pub struct MemoryOutbox {
    shared: Arc<Shared>,
}

impl Default for MemoryOutbox {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryOutbox {
    /// An empty outbox on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty outbox whose `creado_en` comes from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let lanes = (0..LANES)
            .map(|slot| SlotLease {
                slot,
                owner: None,
                incarnation: 0,
                token: 0,
                expires_at_ms: 0,
            })
            .collect();
        let state = State {
            next_seq: 1,
            rows: Vec::new(),
            lanes,
            instances: HashMap::new(),
        };
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                commits: Notify::new(),
                clock,
            }),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a test thread panicked; the data is still usable.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enqueues and commits at once.
    pub fn enqueue(&self, events: &[NewEvent]) {
        self.begin(events).commit();
    }

    /// Inserts `events` in a transaction left open: their sequence numbers are taken now, they
    /// become visible on [`MemoryTx::commit`], and vanish if the handle is dropped.
    pub fn begin(&self, events: &[NewEvent]) -> MemoryTx {
        let now = self.shared.clock.now_ms();
        let mut state = self.state();
        let rows = events
            .iter()
            .map(|e| {
                let seq = state.next_seq;
                state.next_seq += 1;
                StoredRow {
                    lane: lane_of(&e.aggregate_id),
                    published_at_ms: None,
                    next_attempt_ms: None,
                    last_error: None,
                    held_at_ms: None,
                    row: OutboxRow {
                        id: e.id,
                        aggregate: e.aggregate.clone(),
                        aggregate_id: e.aggregate_id.clone(),
                        kind: e.kind.clone(),
                        version: e.version,
                        payload: RawJson::from_value(&e.payload),
                        created_at_ms: now,
                        seq,
                        attempts: 0,
                        headers: e.headers.clone(),
                    },
                }
            })
            .collect();
        MemoryTx {
            outbox: self.clone(),
            rows,
        }
    }
}

/// A transaction of [`MemoryOutbox::begin`]; dropping it rolls back.
#[derive(Debug)]
#[must_use = "dropping the transaction rolls it back"]
pub struct MemoryTx {
    outbox: MemoryOutbox,
    rows: Vec<StoredRow>,
}

impl MemoryTx {
    /// Makes the rows visible and wakes waiting relays.
    pub fn commit(self) {
        let mut state = self.outbox.state();
        state.rows.extend(self.rows);
        // Keep storage in sequence order, as an index on `seq` would return it.
        state.rows.sort_by_key(|r| r.row.seq);
        drop(state);
        self.outbox.shared.commits.notify_waiters();
    }
}

#[async_trait]
impl LaneLeases for MemoryOutbox {
    async fn balance(
        &self,
        owner: &Holder,
        now_ms: i64,
        ttl: Duration,
    ) -> Result<Vec<LaneLease>, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let mut state = self.state();
        state.instances.insert(owner.name.clone(), now_ms);
        let live = state
            .instances
            .values()
            .filter(|seen| **seen > now_ms - ttl_ms)
            .count();
        let plan = plan_balance(owner, &state.lanes, live, now_ms);
        plan.apply(&mut state.lanes, owner, now_ms.saturating_add(ttl_ms));
        let held = plan.held();
        Ok(state
            .lanes
            .iter()
            .filter(|l| held.contains(&l.slot))
            .map(|l| LaneLease {
                lane: l.slot,
                owner: owner.name.clone(),
                token: l.token,
                expires_at_ms: l.expires_at_ms,
            })
            .collect())
    }

    async fn release_all(&self, owner: &Holder) -> Result<(), StoreError> {
        let mut state = self.state();
        for lease in state.lanes.iter_mut() {
            if lease.held_by(owner) {
                lease.owner = None;
            }
        }
        state.instances.remove(&owner.name);
        Ok(())
    }
}

#[async_trait]
impl OutboxReader for MemoryOutbox {
    async fn pending(&self, lane: u32, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        let now = self.shared.clock.now_ms();
        let state = self.state();
        Ok(state
            .readable(lane, i64::MIN, now)
            .take(limit)
            .map(|r| r.row.clone())
            .collect())
    }

    async fn mark_published(
        &self,
        lease: &LaneLease,
        ids: &[Uuid],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut state = self.state();
        if !state.holds(lease) {
            return Err(StoreError::LeaseLost {
                what: format!("outbox lane {}", lease.lane),
            });
        }
        for row in state.rows.iter_mut() {
            if row.lane == lease.lane && ids.contains(&row.row.id) && row.published_at_ms.is_none()
            {
                row.published_at_ms = Some(now_ms);
            }
        }
        Ok(())
    }

    async fn record_refusal(
        &self,
        lease: &LaneLease,
        refusal: &Refusal,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut state = self.state();
        if !state.holds(lease) {
            return Err(StoreError::LeaseLost {
                what: format!("outbox lane {}", lease.lane),
            });
        }
        let row = state.rows.iter_mut().find(|r| {
            r.row.id == refusal.id && r.lane == lease.lane && r.published_at_ms.is_none()
        });
        if let Some(row) = row {
            row.row.attempts = row.row.attempts.saturating_add(1);
            row.last_error = Some(refusal.error.clone());
            row.next_attempt_ms = refusal.retry_at_ms;
            row.held_at_ms = refusal.holds().then_some(now_ms);
        }
        Ok(())
    }

    async fn pending_lanes(
        &self,
        lanes: &[u32],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        let cursors: Vec<LaneCursor> = lanes
            .iter()
            .map(|&lane| LaneCursor {
                lane,
                after_seq: i64::MIN,
            })
            .collect();
        self.pending_lanes_after(&cursors, limit).await
    }

    async fn pending_lanes_after(
        &self,
        cursors: &[LaneCursor],
        limit: usize,
    ) -> Result<Vec<LaneRows>, StoreError> {
        let now = self.shared.clock.now_ms();
        let state = self.state();
        Ok(cursors
            .iter()
            .map(|c| LaneRows {
                lane: c.lane,
                rows: state
                    .readable(c.lane, c.after_seq, now)
                    .take(limit)
                    .map(|r| r.row.clone())
                    .collect(),
            })
            .filter(|found| !found.rows.is_empty())
            .collect())
    }

    async fn mark_published_lanes(
        &self,
        marks: &[LaneMark],
        now_ms: i64,
    ) -> Result<Vec<u32>, StoreError> {
        // One lock for every lane, as the database backends use one statement or transaction.
        let mut state = self.state();
        let mut lost = Vec::new();
        for mark in marks {
            let lease = &mark.lease;
            if !state.holds(lease) {
                lost.push(lease.lane);
                continue;
            }
            for row in state.rows.iter_mut() {
                if row.lane == lease.lane
                    && row.published_at_ms.is_none()
                    && mark.ids.contains(&row.row.id)
                {
                    row.published_at_ms = Some(now_ms);
                }
            }
        }
        Ok(lost)
    }
}

#[async_trait]
impl OutboxWakeup for MemoryOutbox {
    async fn wait(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.shared.commits.notified()).await;
    }
}
