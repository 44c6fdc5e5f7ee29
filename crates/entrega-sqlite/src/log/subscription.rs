//! One member's view of a consumer group: balanced partitions, in-memory read positions,
//! fenced commits.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{Record, Subscription, TransportError};
use tokio::time::Instant;

use super::group::{self, Member};
use super::ttl_ms;
use super::SqliteLog;

/// A partition this member holds.
#[derive(Debug, Clone, Copy)]
struct Assigned {
    /// Fencing token of the lease; commits carry it.
    token: i64,
    /// Next offset to return from `poll`.
    position: i64,
    /// Held back until then. Timer time (not the lease clock), like `poll`'s wait, so a
    /// paused tokio runtime drives it in tests.
    paused_until: Option<Instant>,
}

/// A group member on the SQLite log.
#[derive(Debug)]
pub(super) struct SqliteSubscription {
    log: SqliteLog,
    group: String,
    topic: String,
    member: String,
    assigned: BTreeMap<u32, Assigned>,
    /// Clock time of the last heartbeat-and-balance, if any.
    last_balance_ms: Option<i64>,
    /// Partition to serve first on the next poll, so a busy partition cannot starve others.
    next_first: u32,
    closed: bool,
}

impl SqliteSubscription {
    pub(super) fn new(log: SqliteLog, group: String, topic: String, member: String) -> Self {
        Self {
            log,
            group,
            topic,
            member,
            assigned: BTreeMap::new(),
            last_balance_ms: None,
            next_first: 0,
            closed: false,
        }
    }

    fn who(&self) -> Member<'_> {
        Member {
            group: &self.group,
            topic: &self.topic,
            member: &self.member,
        }
    }

    /// Heartbeats and rebalances if `heartbeat` has passed since the last time.
    async fn maybe_balance(&mut self) -> Result<(), TransportError> {
        let now = self.log.clock.now_ms();
        let heartbeat = ttl_ms(self.log.config.heartbeat);
        let due = match self.last_balance_ms {
            None => true,
            // A clock that went backwards also triggers a balance rather than a long silence.
            Some(last) => now.saturating_sub(last) >= heartbeat || now < last,
        };
        if !due {
            return Ok(());
        }
        let held = group::balance(
            &self.log.pool,
            self.who(),
            now,
            ttl_ms(self.log.config.lease_ttl),
        )
        .await?;
        let mut assigned = BTreeMap::new();
        for h in held {
            let kept = self
                .assigned
                .get(&h.partition)
                .filter(|a| a.token == h.token)
                .copied();
            // A partition held without interruption keeps its read position; a newly
            // acquired one starts at the group's committed offset.
            let entry = kept.unwrap_or(Assigned {
                token: h.token,
                position: h.committed.unwrap_or(0),
                paused_until: None,
            });
            assigned.insert(h.partition, entry);
        }
        self.assigned = assigned;
        self.last_balance_ms = Some(now);
        Ok(())
    }

    /// Reads up to `max` records from held, unpaused partitions and advances their positions.
    async fn read_assigned(&mut self, max: usize) -> Result<Vec<Record>, TransportError> {
        let now = Instant::now();
        let mut order: Vec<u32> = self.assigned.keys().copied().collect();
        let split = order.partition_point(|p| *p < self.next_first);
        order.rotate_left(split);
        let mut out = Vec::new();
        for partition in order {
            if out.len() >= max {
                break;
            }
            let Some(state) = self.assigned.get_mut(&partition) else {
                continue;
            };
            match state.paused_until {
                Some(until) if until > now => continue,
                Some(_) => state.paused_until = None,
                None => {}
            }
            let from = state.position;
            let records = self
                .log
                .read(&self.topic, partition, from, max - out.len())
                .await?;
            if let (Some(last), Some(state)) = (records.last(), self.assigned.get_mut(&partition)) {
                state.position = last.offset + 1;
                self.next_first = partition + 1;
            }
            out.extend(records);
        }
        Ok(out)
    }
}

#[async_trait]
impl Subscription for SqliteSubscription {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Record>, TransportError> {
        if self.closed {
            return Err(TransportError::Rejected {
                reason: format!(
                    "subscription of `{}` to `{}` is closed",
                    self.member, self.topic
                ),
            });
        }
        let deadline = Instant::now() + wait;
        let max = max.max(1);
        loop {
            // Taken before reading, so an append that lands after the read still wakes us.
            let seen = self.log.signals.log.current();
            self.maybe_balance().await?;
            let records = self.read_assigned(max).await?;
            if !records.is_empty() {
                return Ok(records);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(records);
            }
            let nap = self.log.config.poll_interval.min(deadline - now);
            self.log.signals.log.wait_past(seen, nap).await;
        }
    }

    async fn commit(&mut self, offsets: &[(u32, i64)]) -> Result<(), TransportError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut fenced = Vec::with_capacity(offsets.len());
        for &(partition, next_offset) in offsets {
            let Some(state) = self.assigned.get(&partition) else {
                return Err(TransportError::NotAssigned {
                    topic: self.topic.clone(),
                    partition,
                });
            };
            fenced.push((partition, state.token, next_offset));
        }
        let now = self.log.clock.now_ms();
        match group::commit(&self.log.pool, self.who(), &fenced, now).await? {
            None => Ok(()),
            Some(partition) => {
                // Someone else holds it now; stop reading it until a balance gives it back.
                self.assigned.remove(&partition);
                Err(TransportError::NotAssigned {
                    topic: self.topic.clone(),
                    partition,
                })
            }
        }
    }

    fn seek(&mut self, partition: u32, offset: i64) {
        if let Some(state) = self.assigned.get_mut(&partition) {
            state.position = offset.max(0);
        }
    }

    fn pause_for(&mut self, partition: u32, until: Duration) {
        if let Some(state) = self.assigned.get_mut(&partition) {
            let now = Instant::now();
            // An absurd pause still pauses, for as long as the timer can express.
            state.paused_until = now
                .checked_add(until)
                .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)));
        }
    }

    fn assignment(&self) -> Vec<u32> {
        self.assigned.keys().copied().collect()
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        if self.closed {
            return Ok(());
        }
        group::leave(&self.log.pool, self.who()).await?;
        self.assigned.clear();
        self.closed = true;
        Ok(())
    }
}
