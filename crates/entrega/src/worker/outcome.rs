//! One subscription's processing: from a poll's records to final outcomes and offsets.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use entrega_core::{Envelope, HandlerError, OutgoingMessage, Record, Subscription, TransportError};

use super::dead_letter::dead_letter;
use super::panics::{guarded_batch, NoResult};
use super::router::{Message, Route};
use super::{Worker, WorkerStats};
use crate::failpoint;

/// Where one record goes before any handler runs.
enum Target {
    Handler(usize),
    Ignored,
    Dead(String),
}

struct Item {
    record: Record,
    attempt: u32,
    target: Target,
    message: Option<Message>,
}

/// The outcome of one record, before it is applied to offsets and positions.
enum Decision {
    Ack,
    Ignore,
    Dead(String),
    Retry(Duration),
    NotAttempted,
}

impl Decision {
    /// Whether later records of the same partition must wait (they come again in order).
    fn blocks(&self) -> bool {
        matches!(self, Self::Retry(_) | Self::NotAttempted)
    }
}

pub(super) struct Session<'w> {
    worker: &'w Worker,
    sub: Box<dyn Subscription>,
    /// Per partition: the offset being retried and the attempts made on it.
    attempts: HashMap<u32, (i64, u32)>,
    /// Next offsets whose outcomes are final but not yet committed.
    uncommitted: BTreeMap<u32, i64>,
}

impl<'w> Session<'w> {
    pub(super) fn new(worker: &'w Worker, sub: Box<dyn Subscription>) -> Self {
        Self {
            worker,
            sub,
            attempts: HashMap::new(),
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

    fn stats(&self) -> &WorkerStats {
        &self.worker.stats
    }

    fn prepare(&self, record: Record) -> Item {
        let attempt = match self.attempts.get(&record.partition) {
            Some((offset, made)) if *offset == record.offset => made + 1,
            _ => 1,
        };
        let envelope = match Envelope::parse_with(&record.payload, &self.worker.config.limits) {
            Ok(envelope) => envelope,
            Err(e) => {
                return Item {
                    record,
                    attempt,
                    target: Target::Dead(e.to_string()),
                    message: None,
                }
            }
        };
        let target = match self.worker.router.resolve(&envelope.kind) {
            Route::Handler(index) => Target::Handler(index),
            Route::Ignored => Target::Ignored,
            Route::Unknown => Target::Dead(format!("unknown tipo `{}`", envelope.kind)),
        };
        let message = matches!(target, Target::Handler(_)).then(|| Message {
            envelope,
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
            key: record.key.clone(),
            headers: record.headers.clone(),
            attempt,
        });
        Item {
            record,
            attempt,
            target,
            message,
        }
    }

    /// Decides and applies the outcome of every record of one poll, in order, handing
    /// consecutive records of one handler over as a batch.
    pub(super) async fn process(&mut self, records: Vec<Record>) {
        let mut items: Vec<Item> = records.into_iter().map(|r| self.prepare(r)).collect();
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
                    let decisions = self.run_handler(index, &mut items, &group).await;
                    (group, decisions, j)
                }
                Target::Ignored => (vec![i], vec![Decision::Ignore], i + 1),
                Target::Dead(ref reason) => (vec![i], vec![Decision::Dead(reason.clone())], i + 1),
            };
            self.settle(&items, &group, decisions, &mut blocked).await;
            i = next;
        }
    }

    async fn run_handler(
        &mut self,
        index: usize,
        items: &mut [Item],
        group: &[usize],
    ) -> Vec<Decision> {
        let msgs: Vec<Message> = group
            .iter()
            .filter_map(|k| items[*k].message.take())
            .collect();
        let Some(handler) = self.worker.router.handler(index) else {
            return msgs.iter().map(|_| Decision::NotAttempted).collect();
        };
        let mut results = guarded_batch(handler.as_ref(), &msgs).await;
        if let Err(e) = failpoint::hit(failpoint::WORKER_AFTER_HANDLER) {
            results = vec![Err(HandlerError::transient(e))];
        }
        if results.is_empty() && !msgs.is_empty() {
            // Treated as a failure of the first message, or the batch would spin forever.
            results.push(Err(HandlerError::transient(NoResult)));
        }
        let cfg = &self.worker.config;
        msgs.iter()
            .enumerate()
            .map(|(k, msg)| match results.get(k) {
                None => Decision::NotAttempted,
                Some(Ok(())) => Decision::Ack,
                Some(Err(e)) if e.is_transient() && msg.attempt < cfg.max_attempts => {
                    Decision::Retry(cfg.backoff.delay(msg.attempt))
                }
                Some(Err(e)) if e.is_transient() => Decision::Dead(format!(
                    "transient exhausted after {} attempts: {}",
                    msg.attempt,
                    e.inner()
                )),
                Some(Err(e)) => Decision::Dead(e.to_string()),
            })
            .collect()
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
            if let Err(e) = self.publish_dead_letters(&batch).await {
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
                Decision::Retry(after) => {
                    WorkerStats::bump(&self.stats().retried);
                    self.sub.seek(partition, offset);
                    self.sub.pause_for(partition, after);
                    self.attempts.insert(partition, (offset, item.attempt));
                    blocked.insert(partition);
                    continue;
                }
                Decision::NotAttempted => {
                    self.sub.seek(partition, offset);
                    // Not an attempt: the next delivery gets the same number again.
                    match item.attempt {
                        1 => self.attempts.remove(&partition),
                        n => self.attempts.insert(partition, (offset, n - 1)),
                    };
                    blocked.insert(partition);
                    continue;
                }
            }
            if self
                .attempts
                .get(&partition)
                .is_some_and(|(o, _)| *o == offset)
            {
                self.attempts.remove(&partition);
            }
            let next = self.uncommitted.entry(partition).or_insert(offset + 1);
            *next = (*next).max(offset + 1);
        }
    }

    async fn publish_dead_letters(
        &mut self,
        batch: &[OutgoingMessage],
    ) -> Result<(), TransportError> {
        let first = self.worker.publisher.publish(batch).await;
        let Err(TransportError::UnknownTopic { .. }) = &first else {
            return first;
        };
        let Some(admin) = &self.worker.admin else {
            return first;
        };
        let cfg = &self.worker.config;
        admin
            .ensure_topic(&cfg.dlq_topic(), cfg.dlq_partitions)
            .await?;
        self.worker.publisher.publish(batch).await
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
