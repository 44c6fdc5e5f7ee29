//! Ordered retries: which keys are parked in the partitions this member holds, and the drain
//! that retries each parked key's head when it is due.
//!
//! The source consumer and the drain of a partition run in the same member, one after the
//! other, so a record of a parked key never overtakes a parked one: it is parked behind them.
//! A partition's parked keys are loaded from the store before any of its records is handled,
//! so a member that takes a partition over keeps the order its predecessor started.

use std::collections::{BTreeSet, HashMap};

use entrega_core::{ParkedAt, ParkedRecord, Record};
use futures::stream::{self, StreamExt};

use super::dead_letter::{dead_letter, publish_set_aside};
use super::decision::Decision;
use super::held::{settle_refused, Settled};
use super::item::{route, run_handler, Item, Target};
use super::retry::Role;
use super::session::Session;
use super::{RetryStrategy, Worker, WorkerStats};

/// Parked keys per partition; a partition is present once its keys were loaded.
#[derive(Debug, Default)]
pub(super) struct ParkedKeys {
    partitions: HashMap<u32, BTreeSet<Option<String>>>,
}

impl ParkedKeys {
    /// `Some(parked)` when the partition's keys are known, `None` when not loaded yet.
    pub(super) fn contains(&self, partition: u32, key: Option<&str>) -> Option<bool> {
        self.partitions
            .get(&partition)
            .map(|keys| keys.contains(&key.map(str::to_owned)))
    }

    pub(super) fn insert(&mut self, partition: u32, key: Option<String>) {
        self.partitions.entry(partition).or_default().insert(key);
    }

    /// Keeps only the partitions this member still holds: one given back is loaded again.
    pub(super) fn retain(&mut self, assigned: &[u32]) {
        self.partitions.retain(|p, _| assigned.contains(p));
    }

    fn pairs(&self) -> Vec<(u32, Option<String>)> {
        self.partitions
            .iter()
            .flat_map(|(p, keys)| keys.iter().map(|k| (*p, k.clone())))
            .collect()
    }
}

/// How one key's drain ended.
enum Drained {
    /// No record of the key is parked any more: it flows directly again.
    Empty,
    /// The head is not due, failed again, or the store could not be read.
    Waiting,
}

impl Session<'_> {
    fn ordered(&self) -> bool {
        self.worker.config.retry == RetryStrategy::Ordered && self.role == Role::Source
    }

    /// Loads the parked keys of every partition among `partitions` not known yet. A partition
    /// whose keys cannot be read stays unknown: its records wait (see `prepare`).
    pub(super) async fn load_parked(&mut self, partitions: &BTreeSet<u32>) {
        if !self.ordered() {
            return;
        }
        let Some(store) = &self.worker.parking else {
            return;
        };
        let cfg = &self.worker.config;
        for &partition in partitions {
            if self.parked.contains(partition, None).is_some() {
                continue;
            }
            let at = ParkedAt {
                group: &cfg.group,
                topic: &cfg.topic,
                partition,
            };
            match store.parked_keys(at).await {
                Ok(keys) => {
                    let entry = self.parked.partitions.entry(partition).or_default();
                    entry.extend(keys);
                }
                Err(e) => tracing::warn!(partition, error = %e, "loading parked keys failed"),
            }
        }
    }

    /// Retries the due heads of the parked keys of the partitions this member holds, up to
    /// `key_concurrency` keys at once; a key whose records are all gone flows again.
    pub(super) async fn drain_parked(&mut self) {
        if !self.ordered() {
            return;
        }
        let assigned = self.sub.assignment();
        self.parked.retain(&assigned);
        let worker = self.worker;
        let limit = worker.config.key_concurrency.max(1);
        let emptied: Vec<(u32, Option<String>)> = stream::iter(self.parked.pairs())
            .map(|(partition, key)| async move {
                let drained = drain_key(worker, partition, key.as_deref()).await;
                (partition, key, drained)
            })
            .buffer_unordered(limit)
            .filter_map(|(p, key, drained)| async move {
                matches!(drained, Drained::Empty).then_some((p, key))
            })
            .collect()
            .await;
        for (partition, key) in emptied {
            if let Some(keys) = self.parked.partitions.get_mut(&partition) {
                keys.remove(&key);
            }
        }
    }
}

/// Retries `key`'s parked head while it is due and its outcome becomes final.
async fn drain_key(worker: &Worker, partition: u32, key: Option<&str>) -> Drained {
    let Some(store) = &worker.parking else {
        return Drained::Waiting;
    };
    let cfg = &worker.config;
    let at = ParkedAt {
        group: &cfg.group,
        topic: &cfg.topic,
        partition,
    };
    loop {
        let head = match store.head(at, key).await {
            Ok(Some(head)) => head,
            Ok(None) => return Drained::Empty,
            Err(e) => {
                tracing::warn!(partition, error = %e, "reading a parked head failed");
                return Drained::Waiting;
            }
        };
        let now_ms = worker.clock.now_ms();
        if head.not_before_ms > now_ms {
            return Drained::Waiting;
        }
        let offset = head.offset;
        let final_outcome = match try_head(worker, head, now_ms).await {
            Some(outcome) => outcome,
            None => return Drained::Waiting,
        };
        if let Err(e) = store.remove(at, offset).await {
            // Tried again later; the idempotent handler absorbs the repeat.
            tracing::warn!(partition, offset, error = %e, "removing a parked record failed");
            return Drained::Waiting;
        }
        if let Decision::Dead(reason) | Decision::Held(reason) = &final_outcome {
            let origin = super::dead_letter::LetterOrigin {
                topic: &cfg.topic,
                partition,
                offset,
                key,
            };
            let held = matches!(final_outcome, Decision::Held(_));
            super::dead_letter::dead_lettered(&worker.config.group, &origin, reason, held);
        }
        if matches!(final_outcome, Decision::Held(_)) {
            crate::metrics::held_letter(&worker.config.group);
            WorkerStats::bump(&worker.stats.held);
        }
        WorkerStats::bump(match final_outcome {
            Decision::Ignore => &worker.stats.ignored,
            Decision::Dead(_) | Decision::Held(_) => &worker.stats.dead_lettered,
            _ => &worker.stats.acked,
        });
    }
}

/// One attempt at a parked head. `Some(decision)` when its outcome is final (applied,
/// ignored, or dead-lettered and published); `None` when it stays parked (rescheduled).
async fn try_head(worker: &Worker, head: ParkedRecord, now_ms: i64) -> Option<Decision> {
    let cfg = &worker.config;
    let at = ParkedAt {
        group: &cfg.group,
        topic: &cfg.topic,
        partition: head.partition,
    };
    let attempts = head.attempts;
    let mut item = Item {
        attempt: attempts.saturating_add(1),
        base: attempts,
        target: Target::Done,
        message: None,
        record: Record {
            topic: head.topic,
            partition: head.partition,
            offset: head.offset,
            key: head.key,
            headers: head.headers,
            payload: head.payload,
            timestamp_ms: head.parked_at_ms,
        },
    };
    route(worker, &mut item);
    let decision = match item.target {
        Target::Handler(index) => {
            let msgs = item.message.take().into_iter().collect();
            run_handler(worker, index, msgs)
                .await
                .into_iter()
                .next()
                .unwrap_or(Decision::NotAttempted)
        }
        _ => item.decide_alone(),
    };
    let store = worker.parking.as_ref()?;
    match decision {
        Decision::Ack | Decision::Ignore | Decision::Skip => Some(decision),
        Decision::Dead(reason) => {
            let letter = dead_letter(cfg, &item.record, item.attempt, &reason);
            // One letter: `settle_refused` publishes it alone, and holds it if refused.
            let outcome = if worker.held.is_some() {
                let letters = vec![(&item.record, item.attempt, letter)];
                let mut settled = settle_refused(worker, letters).await;
                settled.pop().unwrap_or(Settled::Again(String::new()))
            } else {
                match publish_set_aside(worker, std::slice::from_ref(&letter)).await {
                    Ok(()) => Settled::Published,
                    Err(e) => Settled::Again(e.to_string()),
                }
            };
            match outcome {
                Settled::Published => Some(Decision::Dead(reason)),
                Settled::Held => Some(Decision::Held(reason)),
                Settled::Again(e) => {
                    tracing::warn!(error = %e, "dead-letter publish of a parked record failed");
                    None
                }
            }
        }
        Decision::Retry(f) => {
            WorkerStats::bump(&worker.stats.retried);
            let after = i64::try_from(f.after.as_millis()).unwrap_or(i64::MAX);
            let next = now_ms.saturating_add(after);
            if let Err(e) = store
                .reschedule(at, item.record.offset, item.attempt, next, &f.error)
                .await
            {
                tracing::warn!(error = %e, "rescheduling a parked record failed");
            }
            None
        }
        _ => None,
    }
}
