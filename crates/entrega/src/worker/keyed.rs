//! Per-key concurrency: a poll's records run as per-key chains, up to `key_concurrency` at
//! once, then the outcomes are settled partition by partition.
//!
//! A chain runs its records in offset order and stops at the first one that must come again
//! (a transient failure, or a record the handler did not attempt); the rest of the chain waits
//! for the next round. A partition commits up to its lowest unfinished record, is rewound to
//! it, and the records above it that already finished are remembered so that their
//! redelivery is skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::stream::{self, StreamExt};

use super::chains;
use super::decision::Decision;
use super::divert::divert;
use super::item::{run_handler, Item};
use super::retry::Role;
use super::session::Session;
use super::{RetryStrategy, Worker, WorkerStats};

impl Session<'_> {
    /// Runs the records as per-key chains, at most `limit` at once, then settles them.
    pub(super) async fn process_by_key(&mut self, items: Vec<Item>, limit: usize) {
        let plan = chains::plan(
            items
                .iter()
                .map(|item| (item.record.partition, item.record.key.as_deref())),
        );
        let mut slots: Vec<Option<Item>> = items.into_iter().map(Some).collect();
        let chains: Vec<Vec<(usize, Item)>> = plan
            .into_iter()
            .map(|chain| {
                chain
                    .into_iter()
                    .filter_map(|i| slots.get_mut(i).and_then(Option::take).map(|it| (i, it)))
                    .collect()
            })
            .collect();
        let (worker, role) = (self.worker, self.role);
        let mut outcomes: Vec<(usize, Item, Decision)> = stream::iter(chains)
            .map(|chain| run_chain(worker, role, chain))
            .buffer_unordered(limit)
            .flat_map(stream::iter)
            .collect()
            .await;
        // Back in poll order, which is offset order within each partition.
        outcomes.sort_by_key(|(i, _, _)| *i);
        let mut partitions: BTreeMap<u32, Vec<(Item, Decision)>> = BTreeMap::new();
        for (_, item, decision) in outcomes {
            partitions
                .entry(item.record.partition)
                .or_default()
                .push((item, decision));
        }
        for (partition, outcomes) in partitions {
            self.settle_partition(partition, outcomes);
        }
    }

    /// Applies one partition's decisions, in offset order: counts them, commits up to the
    /// lowest record that comes again, rewinds to it (pausing for the longest wait among the
    /// partition's retried records) and remembers what finished above it.
    fn settle_partition(&mut self, partition: u32, outcomes: Vec<(Item, Decision)>) {
        let Some(first) = outcomes.first().map(|(item, _)| item.record.offset) else {
            return;
        };
        let mut next = first;
        let mut rewind: Option<i64> = None;
        let mut pause: Option<Duration> = None;
        let mut done_above = Vec::new();
        for (item, decision) in outcomes {
            let offset = item.record.offset;
            if !self.count_final(&item, &decision) {
                let local = item.local_attempt();
                match decision {
                    Decision::Retry(f) => {
                        WorkerStats::bump(&self.worker.stats.retried);
                        self.tracker.failed(partition, offset, local);
                        pause = Some(pause.map_or(f.after, |p| p.max(f.after)));
                    }
                    Decision::Wait(after) => {
                        self.tracker.not_attempted(partition, offset, local);
                        pause = Some(pause.map_or(after, |p| p.max(after)));
                    }
                    _ => self.tracker.not_attempted(partition, offset, local),
                }
                rewind.get_or_insert(offset);
                continue;
            }
            self.tracker.finished(partition, offset);
            match rewind {
                Some(_) => done_above.push(offset),
                None => next = offset + 1,
            }
        }
        let next = rewind.unwrap_or(next);
        if next > first {
            let committed = self.uncommitted.entry(partition).or_insert(next);
            *committed = (*committed).max(next);
        }
        if let Some(offset) = rewind {
            self.sub.seek(partition, offset);
            if let Some(after) = pause {
                self.sub.pause_for(partition, after);
            }
            self.tracker.remember_done(partition, done_above);
        }
        self.tracker.forget_below(partition, next);
    }
}

/// Runs one chain in order, batch by batch, until a record must come again; returns every
/// record of the chain with its decision.
async fn run_chain(
    worker: &Worker,
    role: Role,
    mut chain: Vec<(usize, Item)>,
) -> Vec<(usize, Item, Decision)> {
    let handlers: Vec<Option<usize>> = chain.iter().map(|(_, item)| item.handler()).collect();
    let mut decisions: Vec<Decision> = Vec::with_capacity(chain.len());
    let mut stopped = false;
    // Ordered retries: once the chain's key is parked, the rest of the chain parks behind it.
    let mut parking = false;
    for range in chains::batches(&handlers) {
        let Some(batch) = chain.get_mut(range.clone()) else {
            break;
        };
        if stopped {
            decisions.extend(batch.iter().map(|_| Decision::NotAttempted));
            continue;
        }
        let mut batch_decisions = match handlers.get(range.start).copied().flatten() {
            _ if parking => batch.iter().map(|_| Decision::Park(None)).collect(),
            Some(index) => {
                let msgs = batch
                    .iter_mut()
                    .filter_map(|(_, item)| item.message.take())
                    .collect();
                run_handler(worker, index, msgs).await
            }
            None => batch.iter().map(|(_, item)| item.decide_alone()).collect(),
        };
        batch_decisions.resize_with(batch.len(), || Decision::NotAttempted);
        if worker.config.retry == RetryStrategy::InPlace {
            stop_after_first_block(&mut batch_decisions);
        }
        let items: Vec<&Item> = batch.iter().map(|(_, item)| item).collect();
        divert(worker, role, &items, &mut batch_decisions).await;
        stop_after_first_block(&mut batch_decisions);
        parking |= batch_decisions
            .iter()
            .any(|d| matches!(d, Decision::Parked { .. }));
        stopped = batch_decisions.iter().any(Decision::blocks);
        decisions.extend(batch_decisions);
    }
    chain
        .into_iter()
        .zip(decisions)
        .map(|((i, item), decision)| (i, item, decision))
        .collect()
}

/// Records after the first one that must come again wait for it: they come again too, so a
/// key's records are never finished out of order.
fn stop_after_first_block(decisions: &mut [Decision]) {
    if let Some(stop) = decisions.iter().position(Decision::blocks) {
        for decision in decisions.iter_mut().skip(stop + 1) {
            *decision = Decision::NotAttempted;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{stop_after_first_block, Decision};

    #[test]
    fn records_after_a_block_come_again() {
        let mut decisions = vec![
            Decision::Ack,
            Decision::retry(Duration::from_millis(5), "x"),
            Decision::Ack,
            Decision::Dead(entrega_core::DeadReason::new(
                entrega_core::DeadClass::Rejected,
                "x",
            )),
        ];
        stop_after_first_block(&mut decisions);
        assert!(matches!(decisions[0], Decision::Ack));
        assert!(matches!(decisions[1], Decision::Retry(_)));
        assert!(matches!(decisions[2], Decision::NotAttempted));
        assert!(matches!(decisions[3], Decision::NotAttempted));
    }
}
