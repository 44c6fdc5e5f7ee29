//! Per-partition state that outlives one poll: how often each retried message was attempted,
//! and which messages above a rewind point already have a final outcome.
//!
//! A partition is rewound to its lowest unfinished message, so messages above it whose
//! outcome is already final (acked, ignored, dead-lettered by another key's chain) are
//! delivered again. They are remembered here and skipped on redelivery instead of being
//! handed to a handler twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Debug, Default)]
struct PartitionState {
    /// Offsets that failed transiently → attempts made so far.
    attempts: BTreeMap<i64, u32>,
    /// Offsets with a final outcome that lie above the partition's rewind point.
    done: BTreeSet<i64>,
}

impl PartitionState {
    fn is_empty(&self) -> bool {
        self.attempts.is_empty() && self.done.is_empty()
    }
}

/// Attempts and remembered final offsets, per partition.
#[derive(Debug, Default)]
pub(super) struct Tracker {
    partitions: HashMap<u32, PartitionState>,
}

impl Tracker {
    /// The attempt number of a delivery of `offset`: one more than the attempts made.
    pub(super) fn attempt(&self, partition: u32, offset: i64) -> u32 {
        self.partitions
            .get(&partition)
            .and_then(|p| p.attempts.get(&offset))
            .map_or(1, |made| made.saturating_add(1))
    }

    /// Whether `offset` already has a final outcome and must not be handled again.
    pub(super) fn is_done(&self, partition: u32, offset: i64) -> bool {
        self.partitions
            .get(&partition)
            .is_some_and(|p| p.done.contains(&offset))
    }

    /// `attempt` of `offset` failed; it will be delivered again.
    pub(super) fn failed(&mut self, partition: u32, offset: i64, attempt: u32) {
        self.partitions
            .entry(partition)
            .or_default()
            .attempts
            .insert(offset, attempt);
    }

    /// `attempt` of `offset` was not made after all: the next delivery gets the same number.
    pub(super) fn not_attempted(&mut self, partition: u32, offset: i64, attempt: u32) {
        match attempt.checked_sub(1) {
            Some(made) if made > 0 => self.failed(partition, offset, made),
            _ => self.finished(partition, offset),
        }
    }

    /// `offset` has a final outcome: its attempts are no longer needed.
    pub(super) fn finished(&mut self, partition: u32, offset: i64) {
        if let Some(p) = self.partitions.get_mut(&partition) {
            p.attempts.remove(&offset);
            if p.is_empty() {
                self.partitions.remove(&partition);
            }
        }
    }

    /// `offsets` have final outcomes but will be delivered again after a rewind.
    pub(super) fn remember_done(&mut self, partition: u32, offsets: impl IntoIterator<Item = i64>) {
        let mut offsets = offsets.into_iter().peekable();
        if offsets.peek().is_none() {
            return;
        }
        self.partitions
            .entry(partition)
            .or_default()
            .done
            .extend(offsets);
    }

    /// Drops everything below `next`, the partition's commit point: those offsets are never
    /// delivered to this member again.
    pub(super) fn forget_below(&mut self, partition: u32, next: i64) {
        if let Some(p) = self.partitions.get_mut(&partition) {
            p.attempts = p.attempts.split_off(&next);
            p.done = p.done.split_off(&next);
            if p.is_empty() {
                self.partitions.remove(&partition);
            }
        }
    }

    /// Keeps only the partitions this member still holds; a partition taken away and given
    /// back starts over from the group's committed offset.
    pub(super) fn retain(&mut self, assigned: &[u32]) {
        self.partitions.retain(|p, _| assigned.contains(p));
    }

    /// How many offsets are remembered as done, over all partitions.
    #[cfg(test)]
    fn done_count(&self) -> usize {
        self.partitions.values().map(|p| p.done.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::Tracker;

    #[test]
    fn attempts_are_counted_per_offset() {
        let mut t = Tracker::default();
        assert_eq!(t.attempt(0, 5), 1);
        t.failed(0, 5, 1);
        t.failed(0, 7, 2);
        assert_eq!(t.attempt(0, 5), 2);
        assert_eq!(t.attempt(0, 7), 3);
        assert_eq!(t.attempt(1, 5), 1, "another partition");
        t.finished(0, 5);
        assert_eq!(t.attempt(0, 5), 1);
        assert_eq!(t.attempt(0, 7), 3);
    }

    #[test]
    fn not_attempted_keeps_the_number() {
        let mut t = Tracker::default();
        t.not_attempted(0, 3, 1);
        assert_eq!(t.attempt(0, 3), 1);
        t.failed(0, 3, 1);
        t.not_attempted(0, 3, 2);
        assert_eq!(t.attempt(0, 3), 2);
    }

    #[test]
    fn done_offsets_are_remembered_until_committed() {
        let mut t = Tracker::default();
        t.remember_done(0, [4, 6, 9]);
        assert!(t.is_done(0, 4) && t.is_done(0, 6) && t.is_done(0, 9));
        assert!(!t.is_done(0, 5) && !t.is_done(1, 4));
        t.forget_below(0, 7);
        assert!(!t.is_done(0, 4) && !t.is_done(0, 6));
        assert!(t.is_done(0, 9));
        t.forget_below(0, 10);
        assert_eq!(t.done_count(), 0);
    }

    #[test]
    fn forget_below_keeps_the_commit_point_itself() {
        let mut t = Tracker::default();
        t.failed(0, 3, 2);
        t.failed(0, 1, 1);
        t.forget_below(0, 3);
        assert_eq!(t.attempt(0, 1), 1);
        assert_eq!(t.attempt(0, 3), 3);
    }

    #[test]
    fn partitions_no_longer_held_are_forgotten() {
        let mut t = Tracker::default();
        t.failed(0, 1, 1);
        t.failed(1, 1, 1);
        t.remember_done(1, [2]);
        t.retain(&[0]);
        assert_eq!(t.attempt(0, 1), 2);
        assert_eq!(t.attempt(1, 1), 1);
        assert!(!t.is_done(1, 2));
    }
}
