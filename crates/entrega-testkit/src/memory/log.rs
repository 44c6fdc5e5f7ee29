//! A partitioned log with consumer groups, in memory, following the same rules as the
//! database-backed logs: Kafka placement, offsets in append order, partitions shared by
//! `plan_balance` through fenced leases, commits refused once a partition changed hands.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    partition_for, plan_balance, Clock, OutgoingMessage, Publisher, Record, SlotLease, Subscriber,
    Subscription, SystemClock, TopicAdmin, TransportError,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::harness::LogSettings;

#[derive(Debug, Default)]
struct Group {
    offsets: HashMap<u32, i64>,
    members: HashMap<String, i64>,
    leases: Vec<SlotLease>,
}

#[derive(Debug, Default)]
struct State {
    topics: HashMap<String, Vec<Vec<Record>>>,
    groups: HashMap<(String, String), Group>,
    round_robin: u32,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    appended: Notify,
    clock: Arc<dyn Clock>,
    settings: LogSettings,
}

/// An in-memory log transport: [`Publisher`], [`TopicAdmin`] and [`Subscriber`]. Cheap to
/// clone; clones share the same topics and groups.
#[derive(Debug, Clone)]
pub struct MemoryLog {
    shared: Arc<Shared>,
}

impl Default for MemoryLog {
    fn default() -> Self {
        Self::new()
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl MemoryLog {
    /// A log with default settings on the system clock.
    pub fn new() -> Self {
        Self::with_settings(LogSettings::default(), Arc::new(SystemClock))
    }

    /// A log with the given lease, heartbeat and polling settings, reading time from `clock`.
    pub fn with_settings(settings: LogSettings, clock: Arc<dyn Clock>) -> Self {
        let shared = Shared {
            state: Mutex::default(),
            appended: Notify::new(),
            clock,
            settings,
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a test thread panicked; the data is still usable.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Committed next offsets of `group` on `topic`, by partition.
    pub fn committed(&self, group: &str, topic: &str) -> Vec<(u32, i64)> {
        let state = self.state();
        let key = (group.to_owned(), topic.to_owned());
        let mut out: Vec<(u32, i64)> = state
            .groups
            .get(&key)
            .map(|g| g.offsets.iter().map(|(p, o)| (*p, *o)).collect())
            .unwrap_or_default();
        out.sort_unstable();
        out
    }

    /// Next offset to be written, by partition; empty for an unknown topic.
    pub fn end_offsets(&self, topic: &str) -> Vec<(u32, i64)> {
        let state = self.state();
        state.topics.get(topic).map_or_else(Vec::new, |parts| {
            (0u32..).zip(parts.iter().map(|p| p.len() as i64)).collect()
        })
    }

    /// Up to `max` records of one partition from offset `from`.
    pub fn read(&self, topic: &str, partition: u32, from: i64, max: usize) -> Vec<Record> {
        let state = self.state();
        let from = usize::try_from(from.max(0)).unwrap_or(usize::MAX);
        state
            .topics
            .get(topic)
            .and_then(|parts| parts.get(partition as usize))
            .map(|p| p.iter().skip(from).take(max).cloned().collect())
            .unwrap_or_default()
    }

    /// Every record of a topic, partition by partition, in offset order.
    pub fn records(&self, topic: &str) -> Vec<Record> {
        let state = self.state();
        state
            .topics
            .get(topic)
            .map(|parts| parts.concat())
            .unwrap_or_default()
    }
}

#[async_trait]
impl TopicAdmin for MemoryLog {
    async fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32, TransportError> {
        if partitions == 0 {
            return Err(TransportError::Rejected {
                reason: "a topic needs a partition".into(),
            });
        }
        let mut state = self.state();
        let parts = state
            .topics
            .entry(topic.to_owned())
            .or_insert_with(|| vec![Vec::new(); partitions as usize]);
        Ok(parts.len() as u32)
    }
}

#[async_trait]
impl Publisher for MemoryLog {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        let now = self.shared.clock.now_ms();
        let mut state = self.state();
        // Validate the whole batch first so a rejected batch appends nothing.
        for msg in batch {
            if !state.topics.contains_key(&msg.topic) {
                match self.shared.settings.auto_create_partitions {
                    Some(n) => {
                        state
                            .topics
                            .insert(msg.topic.clone(), vec![Vec::new(); n.max(1) as usize]);
                    }
                    None => {
                        return Err(TransportError::UnknownTopic {
                            topic: msg.topic.clone(),
                        })
                    }
                }
            }
        }
        for msg in batch {
            let rr = state.round_robin;
            state.round_robin = rr.wrapping_add(1);
            let Some(parts) = state.topics.get_mut(&msg.topic) else {
                continue;
            };
            let count = parts.len() as u32;
            let partition = msg
                .key
                .as_deref()
                .map_or(rr % count, |k| partition_for(k, count));
            let Some(log) = parts.get_mut(partition as usize) else {
                continue;
            };
            log.push(Record {
                topic: msg.topic.clone(),
                partition,
                offset: log.len() as i64,
                key: msg.key.clone(),
                headers: msg.headers.clone(),
                payload: msg.payload.clone(),
                timestamp_ms: now,
            });
        }
        drop(state);
        self.shared.appended.notify_waiters();
        Ok(())
    }
}

#[async_trait]
impl Subscriber for MemoryLog {
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        if !self.state().topics.contains_key(topic) {
            return Err(TransportError::UnknownTopic {
                topic: topic.to_owned(),
            });
        }
        Ok(Box::new(MemorySubscription {
            log: self.clone(),
            group: group.to_owned(),
            topic: topic.to_owned(),
            member: member.to_owned(),
            held: BTreeMap::new(),
            paused: HashMap::new(),
            last_balance_ms: None,
            rotation: 0,
        }))
    }
}

#[derive(Debug, Clone, Copy)]
struct Held {
    token: i64,
    position: i64,
}

struct MemorySubscription {
    log: MemoryLog,
    group: String,
    topic: String,
    member: String,
    held: BTreeMap<u32, Held>,
    paused: HashMap<u32, Instant>,
    last_balance_ms: Option<i64>,
    rotation: usize,
}

impl MemorySubscription {
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
                    token: 0,
                    expires_at_ms: 0,
                })
                .collect();
        }
        group.members.insert(self.member.clone(), now);
        let live = group
            .members
            .values()
            .filter(|seen| **seen > now - ttl)
            .count();
        let plan = plan_balance(&self.member, &group.leases, live, now);
        for lease in group.leases.iter_mut() {
            if plan.take.contains(&lease.slot) {
                lease.owner = Some(self.member.clone());
                lease.token += 1;
                lease.expires_at_ms = now.saturating_add(ttl);
            } else if plan.renew.contains(&lease.slot) {
                lease.expires_at_ms = now.saturating_add(ttl);
            } else if plan.release.contains(&lease.slot) {
                lease.owner = None;
            }
        }
        let mut held = BTreeMap::new();
        for lease in group
            .leases
            .iter()
            .filter(|l| l.owner.as_deref() == Some(&self.member))
        {
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
                group.leases.iter().any(|l| {
                    l.slot == *partition
                        && l.owner.as_deref() == Some(&self.member)
                        && l.token == h.token
                })
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
                if lease.owner.as_deref() == Some(&self.member) {
                    lease.owner = None;
                }
            }
            group.members.remove(&self.member);
        }
        self.held.clear();
        Ok(())
    }
}
