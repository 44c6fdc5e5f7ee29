//! A partitioned log with consumer groups, in memory, following the same rules as the
//! database-backed logs: Kafka placement, offsets in append order, partitions shared by
//! `plan_balance` through fenced leases, commits refused once a partition changed hands.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{
    partition_for, Clock, LogInspector, OutgoingMessage, Publisher, Record, SlotLease, Subscriber,
    Subscription, SystemClock, TopicAdmin, TransportError,
};
use tokio::sync::Notify;

use super::log_subscription::MemorySubscription;
use crate::harness::LogSettings;

#[derive(Debug, Default)]
pub(super) struct Group {
    pub(super) offsets: HashMap<u32, i64>,
    pub(super) members: HashMap<String, i64>,
    pub(super) leases: Vec<SlotLease>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) topics: HashMap<String, Vec<Vec<Record>>>,
    pub(super) groups: HashMap<(String, String), Group>,
    round_robin: u32,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) appended: Notify,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) settings: LogSettings,
}

/// An in-memory log transport: [`Publisher`], [`TopicAdmin`] and [`Subscriber`]. Cheap to
/// clone; clones share the same topics and groups.
#[derive(Debug, Clone)]
pub struct MemoryLog {
    pub(super) shared: Arc<Shared>,
}

impl Default for MemoryLog {
    fn default() -> Self {
        Self::new()
    }
}

pub(super) fn millis(d: Duration) -> i64 {
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

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
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
        Ok(Box::new(MemorySubscription::new(
            self.clone(),
            group,
            topic,
            member,
        )))
    }
}

#[async_trait]
impl LogInspector for MemoryLog {
    async fn end_offsets(&self, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        Ok(MemoryLog::end_offsets(self, topic))
    }

    async fn committed(&self, group: &str, topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        Ok(MemoryLog::committed(self, group, topic))
    }

    async fn read(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
        max: usize,
    ) -> Result<Vec<Record>, TransportError> {
        Ok(MemoryLog::read(self, topic, partition, from, max))
    }
}
