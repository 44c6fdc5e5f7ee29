//! One subscription's processing: from a poll's records to final outcomes and offsets.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use entrega_core::{OutgoingMessage, Record, Subscription, TransportError};

use super::dead_letter::{dead_letter, publish_dead_letters};
use super::item::{prepare, run_handler, Decision, Item, Target};
use super::tracker::Tracker;
use super::{Worker, WorkerStats};
use crate::failpoint;

pub(super) struct Session<'w> {
    pub(super) worker: &'w Worker,
    pub(super) sub: Box<dyn Subscription>,
    /// Attempts of retried messages and final messages above a rewind point.
    pub(super) tracker: Tracker,
    /// Next offsets whose outcomes are final but not yet committed.
    pub(super) uncommitted: BTreeMap<u32, i64>,
}

impl<'w> Session<'w> {
    pub(super) fn new(worker: &'w Worker, sub: Box<dyn Subscription>) -> Self {
        Self {
            worker,
            sub,
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
        self.tracker.retain(&self.sub.assignment());
        let items: Vec<Item> = records
            .into_iter()
            .map(|r| prepare(self.worker, &self.tracker, r))
            .collect();
        match self.worker.config.key_concurrency {
            0 | 1 => self.process_in_order(items).await,
            limit => self.process_by_key(items, limit).await,
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

    /// Applies one group's decisions: dead letters are published first (a failed publish
    /// turns them into retries), then offsets advance and partitions rewind, in order.
    async fn settle(
        &mut self,
        items: &[Item],
        group: &[usize],
        mut decisions: Vec<Decision>,
        blocked: &mut HashSet<u32>,
    ) {
        let mut would_block = blocked.clone();
        let mut dead = Vec::new();
        for (k, decision) in decisions.iter().enumerate() {
            let item = &items[group[k]];
            if would_block.contains(&item.record.partition) {
                continue;
            }
            if decision.blocks() {
                would_block.insert(item.record.partition);
            } else if let Decision::Dead(reason) = decision {
                dead.push((
                    k,
                    dead_letter(&self.worker.config, &item.record, item.attempt, reason),
                ));
            }
        }
        if !dead.is_empty() {
            let batch: Vec<OutgoingMessage> = dead.iter().map(|(_, m)| m.clone()).collect();
            if let Err(e) = publish_dead_letters(self.worker, &batch).await {
                tracing::warn!(error = %e, "dead-letter publish failed; retrying the messages");
                for (k, _) in &dead {
                    let attempt = items[group[*k]].attempt;
                    decisions[*k] = Decision::Retry(self.worker.config.backoff.delay(attempt));
                }
            }
        }
        for (k, decision) in decisions.into_iter().enumerate() {
            let item = &items[group[k]];
            let (partition, offset) = (item.record.partition, item.record.offset);
            if blocked.contains(&partition) {
                continue;
            }
            match decision {
                Decision::Ack => WorkerStats::bump(&self.stats().acked),
                Decision::Ignore => WorkerStats::bump(&self.stats().ignored),
                Decision::Dead(_) => WorkerStats::bump(&self.stats().dead_lettered),
                Decision::Skip => WorkerStats::bump(&self.stats().skipped),
                Decision::Retry(after) => {
                    WorkerStats::bump(&self.stats().retried);
                    self.sub.seek(partition, offset);
                    self.sub.pause_for(partition, after);
                    self.tracker.failed(partition, offset, item.attempt);
                    blocked.insert(partition);
                    continue;
                }
                Decision::NotAttempted => {
                    self.sub.seek(partition, offset);
                    self.tracker.not_attempted(partition, offset, item.attempt);
                    blocked.insert(partition);
                    continue;
                }
            }
            self.tracker.finished(partition, offset);
            let next = self.uncommitted.entry(partition).or_insert(offset + 1);
            *next = (*next).max(offset + 1);
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
