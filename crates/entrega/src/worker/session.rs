//! One subscription's session: from a poll's records to final decisions and committed offsets.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use entrega_core::{Record, Subscription, TransportError};

use super::decision::Decision;
use super::divert::divert;
use super::item::{prepare, run_handler, Context, Item, Target};
use super::parked::ParkedKeys;
use super::retry::Role;
use super::tracker::Tracker;
use super::{RetryStrategy, Worker, WorkerStats};
use crate::failpoint;

pub(super) struct Session<'w> {
    pub(super) worker: &'w Worker,
    pub(super) sub: Box<dyn Subscription>,
    /// The source topic, or its retry topic.
    pub(super) role: Role,
    /// Keys parked by ordered retries, per partition held.
    pub(super) parked: ParkedKeys,
    /// Attempts of retried messages and final messages above a rewind point.
    pub(super) tracker: Tracker,
    /// Next offsets whose outcomes are final but not yet committed.
    pub(super) uncommitted: BTreeMap<u32, i64>,
}

impl<'w> Session<'w> {
    pub(super) fn new(worker: &'w Worker, sub: Box<dyn Subscription>, role: Role) -> Self {
        Self {
            worker,
            sub,
            role,
            parked: ParkedKeys::default(),
            tracker: Tracker::default(),
            uncommitted: BTreeMap::new(),
        }
    }

    pub(super) async fn poll(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Record>, TransportError> {
        self.sub.poll(max, wait).await
    }

    pub(super) async fn close(&mut self) -> Result<(), TransportError> {
        self.sub.close().await
    }

    pub(super) fn stats(&self) -> &WorkerStats {
        &self.worker.stats
    }

    /// Decides and applies the outcome of every record of one poll: in order, or as per-key
    /// chains when the worker runs keys concurrently.
    pub(super) async fn process(&mut self, records: Vec<Record>) {
        let assigned = self.sub.assignment();
        self.tracker.retain(&assigned);
        self.parked.retain(&assigned);
        let ordered =
            self.worker.config.retry == RetryStrategy::Ordered && self.role == Role::Source;
        if ordered {
            let partitions: BTreeSet<u32> = records.iter().map(|r| r.partition).collect();
            self.load_parked(&partitions).await;
        }
        let ctx = Context {
            worker: self.worker,
            tracker: &self.tracker,
            role: self.role,
            parked: ordered.then_some(&self.parked),
            now_ms: self.worker.clock.now_ms(),
        };
        let items: Vec<Item> = records.into_iter().map(|r| prepare(&ctx, r)).collect();
        // Ordered retries park per key, so they always run as per-key chains.
        match self.worker.config.key_concurrency {
            0 | 1 if !ordered => self.process_in_order(items).await,
            limit => self.process_by_key(items, limit.max(1)).await,
        }
    }

    /// Runs the records in order, handing consecutive records of one handler over as a batch.
    async fn process_in_order(&mut self, mut items: Vec<Item>) {
        let mut blocked: HashSet<u32> = HashSet::new();
        let mut i = 0;
        while i < items.len() {
            if blocked.contains(&items[i].record.partition) {
                i += 1;
                continue;
            }
            let (group, decisions, next) = match items[i].target {
                Target::Handler(index) => {
                    let mut group = vec![i];
                    let mut j = i + 1;
                    while j < items.len() {
                        if blocked.contains(&items[j].record.partition) {
                            j += 1;
                            continue;
                        }
                        match items[j].target {
                            Target::Handler(other) if other == index => group.push(j),
                            _ => break,
                        }
                        j += 1;
                    }
                    let msgs = group
                        .iter()
                        .filter_map(|k| items[*k].message.take())
                        .collect();
                    let decisions = run_handler(self.worker, index, msgs).await;
                    (group, decisions, j)
                }
                _ => (vec![i], vec![items[i].decide_alone()], i + 1),
            };
            self.settle(&items, &group, decisions, &mut blocked).await;
            i = next;
        }
    }

    /// Applies one group's decisions: what must be set aside is set aside first (a failure
    /// turns it into a retry in place), then offsets advance and partitions rewind, in order.
    async fn settle(
        &mut self,
        items: &[Item],
        group: &[usize],
        mut decisions: Vec<Decision>,
        blocked: &mut HashSet<u32>,
    ) {
        // Records after one that comes again in the same partition come again too: they are
        // neither set aside nor final now.
        let in_place = self.worker.config.retry == RetryStrategy::InPlace;
        let mut would_block = blocked.clone();
        let mut live = Vec::new();
        for (k, decision) in decisions.iter().enumerate() {
            let partition = items[group[k]].record.partition;
            if would_block.contains(&partition) {
                continue;
            }
            live.push(k);
            let retried_in_place = matches!(decision, Decision::Retry(_)) && in_place;
            if retried_in_place || matches!(decision, Decision::Wait(_) | Decision::NotAttempted) {
                would_block.insert(partition);
            }
        }
        let live_items: Vec<&Item> = live.iter().map(|k| &items[group[*k]]).collect();
        let mut live_decisions: Vec<Decision> = live
            .iter()
            .map(|k| std::mem::replace(&mut decisions[*k], Decision::NotAttempted))
            .collect();
        divert(self.worker, self.role, &live_items, &mut live_decisions).await;
        for (item, decision) in live_items.into_iter().zip(live_decisions) {
            let (partition, offset) = (item.record.partition, item.record.offset);
            if blocked.contains(&partition) {
                continue;
            }
            if !self.count_final(item, &decision) {
                self.come_again(item, decision);
                blocked.insert(partition);
                continue;
            }
            self.tracker.finished(partition, offset);
            let next = self.uncommitted.entry(partition).or_insert(offset + 1);
            *next = (*next).max(offset + 1);
        }
    }

    /// Counts a final decision and returns `true`; returns `false` for one that comes again.
    pub(super) fn count_final(&mut self, item: &Item, decision: &Decision) -> bool {
        let stats = &self.worker.stats;
        match decision {
            Decision::Ack => WorkerStats::bump(&stats.acked),
            Decision::Ignore => WorkerStats::bump(&stats.ignored),
            Decision::Dead(reason) | Decision::Held(reason) => {
                let held = matches!(decision, Decision::Held(_));
                WorkerStats::bump(&stats.dead_lettered);
                let r = &item.record;
                let origin = super::dead_letter::LetterOrigin {
                    topic: &r.topic,
                    partition: r.partition,
                    offset: r.offset,
                    key: r.key.as_deref(),
                };
                super::dead_letter::dead_lettered(&self.worker.config.group, &origin, reason, held);
                if held {
                    WorkerStats::bump(&stats.held);
                    crate::metrics::held_letter(&self.worker.config.group);
                }
            }
            Decision::Skip => WorkerStats::bump(&stats.skipped),
            Decision::Deferred => {
                WorkerStats::bump(&stats.retried);
                WorkerStats::bump(&stats.deferred);
            }
            Decision::Parked { head } => {
                if *head {
                    WorkerStats::bump(&stats.retried);
                }
                WorkerStats::bump(&stats.parked);
                self.parked
                    .insert(item.record.partition, item.record.key.clone());
            }
            Decision::Retry(_) | Decision::Wait(_) | Decision::NotAttempted | Decision::Park(_) => {
                return false
            }
        }
        true
    }

    /// Rewinds the partition to a record that comes again, pausing it when it must wait.
    fn come_again(&mut self, item: &Item, decision: Decision) {
        let (partition, offset) = (item.record.partition, item.record.offset);
        self.sub.seek(partition, offset);
        match decision {
            Decision::Retry(f) => {
                WorkerStats::bump(&self.worker.stats.retried);
                self.sub.pause_for(partition, f.after);
                self.tracker.failed(partition, offset, item.local_attempt());
            }
            Decision::Wait(after) => {
                self.sub.pause_for(partition, after);
                self.tracker
                    .not_attempted(partition, offset, item.local_attempt());
            }
            _ => self
                .tracker
                .not_attempted(partition, offset, item.local_attempt()),
        }
    }

    /// Commits every final offset not yet committed. Offsets of partitions this member no
    /// longer holds are dropped (the new holder redelivers); other failures are kept and
    /// committed with the next batch.
    pub(super) async fn commit(&mut self) {
        if self.uncommitted.is_empty() {
            return;
        }
        if let Err(e) = failpoint::hit(failpoint::WORKER_BEFORE_COMMIT) {
            tracing::warn!(error = %e, "offset commit skipped");
            return;
        }
        let offsets: Vec<(u32, i64)> = self.uncommitted.iter().map(|(p, o)| (*p, *o)).collect();
        match self.sub.commit(&offsets).await {
            Ok(()) => self.uncommitted.clear(),
            Err(TransportError::NotAssigned { .. }) => {
                // One lost partition must not hold back the others: commit them one by one.
                for (partition, next) in offsets {
                    match self.sub.commit(&[(partition, next)]).await {
                        Ok(()) | Err(TransportError::NotAssigned { .. }) => {
                            self.uncommitted.remove(&partition);
                        }
                        Err(e) => {
                            WorkerStats::bump(&self.stats().commit_errors);
                            tracing::warn!(partition, error = %e, "offset commit failed");
                        }
                    }
                }
            }
            Err(e) => {
                WorkerStats::bump(&self.stats().commit_errors);
                tracing::warn!(error = %e, "offset commit failed; retrying with the next batch");
            }
        }
    }
}
