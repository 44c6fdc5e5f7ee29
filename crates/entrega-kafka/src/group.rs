//! A member's local view of its group: partitions held, records fetched but not yet handed
//! out, pauses and pending seeks. Kept current by librdkafka's rebalance callbacks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use entrega_core::Record;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::topic_partition_list::TopicPartitionList;

/// What one member holds and has buffered.
#[derive(Debug, Default)]
pub(crate) struct MemberState {
    /// Partitions assigned to this member, as of the last rebalance callback.
    pub held: BTreeSet<u32>,
    /// Records fetched from librdkafka, not yet returned by `poll`, in fetch order.
    pub buffer: VecDeque<Record>,
    /// Paused partitions and when their pause ends.
    pub paused: BTreeMap<u32, Instant>,
    /// Seeks asked for and not yet handed to librdkafka.
    pub seeks: BTreeMap<u32, i64>,
}

impl MemberState {
    /// Forgets everything about partitions taken away: their buffered records go (the next
    /// owner reads them from the committed offset), and so do their pauses and seeks.
    pub fn revoke(&mut self, partitions: &[u32]) {
        for p in partitions {
            self.held.remove(p);
            self.paused.remove(p);
            self.seeks.remove(p);
        }
        self.buffer.retain(|r| !partitions.contains(&r.partition));
    }

    /// Whether records of `partition` may be handed out now.
    pub fn flowing(&self, partition: u32, now: Instant) -> bool {
        self.paused
            .get(&partition)
            .is_none_or(|until| *until <= now)
    }

    /// Buffered records that may be handed out now.
    pub fn ready(&self, now: Instant) -> usize {
        self.buffer
            .iter()
            .filter(|r| self.flowing(r.partition, now))
            .count()
    }

    /// Takes up to `max` records that may be handed out, keeping the rest in order.
    pub fn take(&mut self, max: usize, now: Instant) -> Vec<Record> {
        let mut out = Vec::new();
        let mut kept = VecDeque::with_capacity(self.buffer.len());
        while let Some(r) = self.buffer.pop_front() {
            if out.len() < max && self.flowing(r.partition, now) {
                out.push(r);
            } else {
                kept.push_back(r);
            }
        }
        self.buffer = kept;
        out
    }
}

/// The shared state, locked briefly; never held across a librdkafka call.
pub(crate) type Shared = Arc<Mutex<MemberState>>;

/// Locks the state, recovering it if a thread panicked while holding it: the state stays
/// consistent between statements, so the data is still good.
pub(crate) fn lock(state: &Shared) -> MutexGuard<'_, MemberState> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Consumer context that mirrors rebalances into [`MemberState`]. librdkafka runs these
/// callbacks on the thread calling `poll`, before any record of a newly assigned partition
/// is returned and before revoked partitions are given up.
pub(crate) struct GroupContext {
    topic: String,
    state: Shared,
}

impl GroupContext {
    pub fn new(topic: &str, state: Shared) -> Self {
        Self {
            topic: topic.to_owned(),
            state,
        }
    }

    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<u32> {
        tpl.elements_for_topic(&self.topic)
            .iter()
            .filter_map(|e| u32::try_from(e.partition()).ok())
            .collect()
    }
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let gone = self.partitions(tpl);
            tracing::info!(topic = %self.topic, partitions = ?gone, "partitions revoked");
            lock(&self.state).revoke(&gone);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let new = self.partitions(tpl);
                tracing::info!(topic = %self.topic, partitions = ?new, "partitions assigned");
                // A partition paused while held before, then revoked, comes back flowing: its
                // pause ended with the revocation.
                if tpl.count() > 0 {
                    if let Err(e) = consumer.resume(tpl) {
                        tracing::debug!(topic = %self.topic, error = %e, "resume on assign failed");
                    }
                }
                lock(&self.state).held.extend(new);
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                tracing::warn!(topic = %self.topic, error = %e, "rebalance failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use entrega_core::Headers;
    use std::time::Duration;

    fn rec(partition: u32, offset: i64) -> Record {
        Record {
            topic: "t".into(),
            partition,
            offset,
            key: None,
            headers: Headers::new(),
            payload: Vec::new(),
            timestamp_ms: 0,
        }
    }

    fn offsets(records: &[Record]) -> Vec<(u32, i64)> {
        records.iter().map(|r| (r.partition, r.offset)).collect()
    }

    #[test]
    fn take_skips_paused_partitions_and_keeps_their_order() {
        let now = Instant::now();
        let mut s = MemberState::default();
        s.held.extend([0, 1]);
        s.buffer
            .extend([rec(0, 0), rec(1, 0), rec(0, 1), rec(1, 1), rec(0, 2)]);
        s.paused.insert(0, now + Duration::from_secs(5));
        assert_eq!(s.ready(now), 2);
        assert_eq!(offsets(&s.take(10, now)), vec![(1, 0), (1, 1)]);
        let later = now + Duration::from_secs(6);
        assert_eq!(offsets(&s.take(2, later)), vec![(0, 0), (0, 1)]);
        assert_eq!(offsets(&s.take(2, later)), vec![(0, 2)]);
    }

    #[test]
    fn revoke_drops_buffered_records_of_those_partitions_only() {
        let now = Instant::now();
        let mut s = MemberState::default();
        s.held.extend([0, 1, 2]);
        s.buffer.extend([rec(0, 0), rec(1, 0), rec(2, 0)]);
        s.seeks.insert(1, 0);
        s.revoke(&[1, 2]);
        assert_eq!(s.held, BTreeSet::from([0]));
        assert!(s.seeks.is_empty());
        assert_eq!(offsets(&s.take(10, now)), vec![(0, 0)]);
    }
}
