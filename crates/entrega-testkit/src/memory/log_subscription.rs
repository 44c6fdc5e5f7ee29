//! A member's view of a consumer group on a [`MemoryLog`]: balancing, reading, commits.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{plan_balance, Holder, Record, SlotLease, Subscription, TransportError};
use tokio::time::Instant;

use super::log::{millis, MemoryLog};

#[derive(Debug, Clone, Copy)]
struct Held {
    token: i64,
    position: i64,
}

pub(super) struct MemorySubscription {
    log: MemoryLog,
    group: String,
    topic: String,
    member: Holder,
    held: BTreeMap<u32, Held>,
    paused: HashMap<u32, Instant>,
    last_balance_ms: Option<i64>,
    rotation: usize,
}

impl MemorySubscription {
    pub(super) fn new(log: MemoryLog, group: &str, topic: &str, member: &str) -> Self {
        let member = Holder::new(member, log.shared.clock.now_ms());
        Self {
            log,
            group: group.to_owned(),
            topic: topic.to_owned(),
            member,
            held: BTreeMap::new(),
            paused: HashMap::new(),
            last_balance_ms: None,
            rotation: 0,
        }
    }

    fn balance_if_due(&mut self) {
        let settings = self.log.shared.settings;
        let now = self.log.shared.clock.now_ms();
        if self
            .last_balance_ms
            .is_some_and(|last| now - last < millis(settings.heartbeat))
        {
            return;
        }
        self.last_balance_ms = Some(now);
        let ttl = millis(settings.lease_ttl);
        let mut state = self.log.state();
        let partitions = state.topics.get(&self.topic).map_or(0, |p| p.len() as u32);
        let group = state
            .groups
            .entry((self.group.clone(), self.topic.clone()))
            .or_default();
        if group.leases.len() as u32 != partitions {
            group.leases = (0..partitions)
                .map(|slot| SlotLease {
                    slot,
                    owner: None,
                    incarnation: 0,
                    token: 0,
                    expires_at_ms: 0,
                })
                .collect();
        }
        group.members.insert(self.member.name.clone(), now);
        let live = group
            .members
            .values()
            .filter(|seen| **seen > now - ttl)
            .count();
        let plan = plan_balance(&self.member, &group.leases, live, now);
        plan.apply(&mut group.leases, &self.member, now.saturating_add(ttl));
        let mut held = BTreeMap::new();
        for lease in group.leases.iter().filter(|l| l.held_by(&self.member)) {
            let position = match self.held.get(&lease.slot) {
                Some(h) if h.token == lease.token => h.position,
                // Newly acquired: start where the group left off.
                _ => group.offsets.get(&lease.slot).copied().unwrap_or(0),
            };
            held.insert(
                lease.slot,
                Held {
                    token: lease.token,
                    position,
                },
            );
        }
        self.paused.retain(|p, _| held.contains_key(p));
        self.held = held;
    }

    fn read(&mut self, max: usize) -> Vec<Record> {
        let now = Instant::now();
        self.paused.retain(|_, until| *until > now);
        let state = self.log.state();
        let Some(parts) = state.topics.get(&self.topic) else {
            return Vec::new();
        };
        let order: Vec<u32> = self.held.keys().copied().collect();
        let mut out = Vec::new();
        // Rotate the starting partition so one busy partition cannot starve the others.
        self.rotation = self.rotation.wrapping_add(1);
        for i in 0..order.len() {
            let partition = order[(i + self.rotation) % order.len()];
            if self.paused.contains_key(&partition) || out.len() >= max {
                continue;
            }
            let (Some(log), Some(held)) =
                (parts.get(partition as usize), self.held.get_mut(&partition))
            else {
                continue;
            };
            let from = usize::try_from(held.position.max(0)).unwrap_or(usize::MAX);
            let batch: Vec<Record> = log
                .iter()
                .skip(from)
                .take(max - out.len())
                .cloned()
                .collect();
            held.position += batch.len() as i64;
            out.extend(batch);
        }
        out
    }
}

#[async_trait]
impl Subscription for MemorySubscription {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Record>, TransportError> {
        let deadline = Instant::now() + wait;
        let shared = Arc::clone(&self.log.shared);
        loop {
            let appended = shared.appended.notified();
            tokio::pin!(appended);
            // Registered before reading, so an append after the read still wakes us.
            appended.as_mut().enable();
            self.balance_if_due();
            let records = self.read(max);
            let now = Instant::now();
            if !records.is_empty() || now >= deadline {
                return Ok(records);
            }
            // Wake at least every poll interval: pauses end and the clock may have moved.
            let next = deadline.min(now + shared.settings.poll_interval);
            let _ = tokio::time::timeout_at(next, appended).await;
        }
    }

    async fn commit(&mut self, offsets: &[(u32, i64)]) -> Result<(), TransportError> {
        let mut state = self.log.state();
        let group = state
            .groups
            .entry((self.group.clone(), self.topic.clone()))
            .or_default();
        for (partition, _) in offsets {
            let owned = self.held.get(partition).is_some_and(|h| {
                group
                    .leases
                    .iter()
                    .any(|l| l.slot == *partition && l.held_by(&self.member) && l.token == h.token)
            });
            if !owned {
                return Err(TransportError::NotAssigned {
                    topic: self.topic.clone(),
                    partition: *partition,
                });
            }
        }
        for (partition, next) in offsets {
            group.offsets.insert(*partition, *next);
        }
        Ok(())
    }

    fn seek(&mut self, partition: u32, offset: i64) {
        if let Some(held) = self.held.get_mut(&partition) {
            held.position = offset;
        }
    }

    fn pause_for(&mut self, partition: u32, until: Duration) {
        self.paused.insert(partition, Instant::now() + until);
    }

    fn assignment(&self) -> Vec<u32> {
        self.held.keys().copied().collect()
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        let mut state = self.log.state();
        if let Some(group) = state
            .groups
            .get_mut(&(self.group.clone(), self.topic.clone()))
        {
            for lease in group.leases.iter_mut() {
                if lease.held_by(&self.member) {
                    lease.owner = None;
                }
            }
            group.members.remove(&self.member.name);
        }
        self.held.clear();
        Ok(())
    }
}
