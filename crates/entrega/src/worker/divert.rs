//! Setting records aside before their offsets may advance: dead letters to `<topic>.dlq` (or
//! the transport's dead-letter queue), retries to `<topic>.retry` (or the transport's delay
//! queues), failed keys to the parking store. A record whose setting aside
//! fails is retried in place instead, so nothing is lost.

use std::collections::HashSet;
use std::time::Duration;

use entrega_core::{OutgoingMessage, ParkedRecord, TransportError};

use super::dead_letter::{dead_letter, publish_set_aside};
use super::decision::{Decision, Failure};
use super::held::{settle_refused, Settled};
use super::item::Item;
use super::retry::{retry_message, Role};
use super::{RetryStrategy, Worker};

/// Applies the retry strategy to a batch's decisions and sets aside what must be: on return
/// every `Dead` is published, every `Deferred` and `Parked` stored, and whatever could not be
/// is a `Retry` in place (or `NotAttempted` for a record parked behind a failed head).
pub(super) async fn divert(
    worker: &Worker,
    role: Role,
    items: &[&Item],
    decisions: &mut [Decision],
) {
    let cfg = &worker.config;
    // The common case, a batch that only succeeded, costs no clock read and no allocation.
    let diverts = |d: &Decision| {
        matches!(d, Decision::Dead(_) | Decision::Park(_))
            || (matches!(d, Decision::Retry(_)) && cfg.retry != RetryStrategy::InPlace)
    };
    if !decisions.iter().any(diverts) {
        return;
    }
    let now_ms = worker.clock.now_ms();
    if cfg.retry == RetryStrategy::Ordered && role == Role::Source {
        park_failed_keys(items, decisions);
    }
    let mut outgoing = SetAside::default();
    let mut parks: Vec<(usize, ParkedRecord)> = Vec::new();
    for (k, (item, decision)) in items.iter().zip(decisions.iter()).enumerate() {
        match decision {
            Decision::Dead(reason) => {
                let letter = dead_letter(cfg, &item.record, item.attempt, reason);
                match worker.side {
                    Some(_) => outgoing.dead.push((k, letter)),
                    None => outgoing.topics.push((k, letter)),
                }
            }
            Decision::Retry(f)
                if matches!(
                    cfg.retry,
                    RetryStrategy::RetryTopic | RetryStrategy::DelayQueues
                ) =>
            {
                let message = retry_message(
                    cfg,
                    &item.record,
                    role,
                    item.attempt,
                    now_ms,
                    f.after,
                    &f.error,
                );
                match cfg.retry {
                    RetryStrategy::DelayQueues => outgoing.delayed.push((k, (message, f.after))),
                    _ => outgoing.topics.push((k, message)),
                }
            }
            Decision::Park(failure) => {
                parks.push((k, parked_record(worker, item, failure.as_ref(), now_ms)));
            }
            _ => {}
        }
    }
    let mut refused = Vec::new();
    for (indexes, published) in outgoing.send(worker).await {
        if let Err(e) = &published {
            tracing::warn!(error = %e, "setting messages aside failed; retrying them in place");
        }
        for k in indexes {
            let attempt = items.get(k).map_or(1, |item| item.local_attempt());
            let Some(decision) = decisions.get_mut(k) else {
                continue;
            };
            match (&published, &*decision) {
                (Ok(()), Decision::Retry(_)) => *decision = Decision::Deferred,
                // A retry that could not be sent stays a retry, now in place.
                (Ok(()), _) | (Err(_), Decision::Retry(_)) => {}
                // Tried alone next, and held if the broker refuses it for good.
                (Err(_), Decision::Dead(_)) if worker.held.is_some() => refused.push(k),
                (Err(e), _) => *decision = Decision::retry(cfg.backoff.delay(attempt), e),
            }
        }
    }
    if !refused.is_empty() {
        settle_dead(worker, items, decisions, &refused).await;
    }
    if parks.is_empty() {
        return;
    }
    let Some(store) = &worker.parking else {
        unpark_all(&parks, decisions);
        return;
    };
    let records: Vec<ParkedRecord> = parks.iter().map(|(_, r)| r.clone()).collect();
    match store.park(&records).await {
        Ok(()) => {
            for (k, _) in &parks {
                if let Some(decision) = decisions.get_mut(*k) {
                    let head = matches!(decision, Decision::Park(Some(_)));
                    *decision = Decision::Parked { head };
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "parking failed; retrying in place");
            unpark_all(&parks, decisions);
        }
    }
}

/// The dead letters at `refused` whose publish failed: each tried alone, then held or
/// retried in place ([`settle_refused`]).
async fn settle_dead(
    worker: &Worker,
    items: &[&Item],
    decisions: &mut [Decision],
    refused: &[usize],
) {
    let cfg = &worker.config;
    let mut at = Vec::new();
    let mut letters = Vec::new();
    for &k in refused {
        if let (Some(item), Some(Decision::Dead(reason))) = (items.get(k), decisions.get(k)) {
            let letter = dead_letter(cfg, &item.record, item.attempt, reason);
            at.push(k);
            letters.push((&item.record, item.local_attempt(), letter));
        }
    }
    let settled = settle_refused(worker, letters).await;
    for (k, outcome) in at.into_iter().zip(settled) {
        let attempt = items.get(k).map_or(1, |item| item.local_attempt());
        let Some(decision) = decisions.get_mut(k) else {
            continue;
        };
        *decision = match (std::mem::replace(decision, Decision::NotAttempted), outcome) {
            (Decision::Dead(reason), Settled::Held) => Decision::Held(reason),
            (Decision::Dead(reason), Settled::Published) => Decision::Dead(reason),
            (_, Settled::Again(e)) => Decision::retry(cfg.backoff.delay(attempt), e),
            (other, _) => other,
        };
    }
}

/// What a batch sets aside, by where it goes, each with the index of its record.
#[derive(Default)]
struct SetAside {
    /// Published to `<topic>.dlq` or `<topic>.retry`.
    topics: Vec<(usize, OutgoingMessage)>,
    /// Dead letters into the transport's own dead-letter queue.
    dead: Vec<(usize, OutgoingMessage)>,
    /// Retries into the transport's delay queues, each with its backoff.
    delayed: Vec<(usize, (OutgoingMessage, Duration))>,
}

impl SetAside {
    /// Sends each kind that has messages; returns, per kind sent, the records' indexes and
    /// how it went.
    async fn send(self, worker: &Worker) -> Vec<(Vec<usize>, Result<(), TransportError>)> {
        let cfg = &worker.config;
        let mut sent = Vec::new();
        if !self.topics.is_empty() {
            let (indexes, batch): (Vec<usize>, Vec<OutgoingMessage>) =
                self.topics.into_iter().unzip();
            sent.push((indexes, publish_set_aside(worker, &batch).await));
        }
        let Some(side) = &worker.side else {
            return sent;
        };
        if !self.dead.is_empty() {
            let (indexes, batch): (Vec<usize>, Vec<OutgoingMessage>) =
                self.dead.into_iter().unzip();
            let published = side.dead_letter(&cfg.group, &cfg.topic, &batch).await;
            sent.push((indexes, published));
        }
        if !self.delayed.is_empty() {
            let (indexes, batch): (Vec<usize>, Vec<(OutgoingMessage, Duration)>) =
                self.delayed.into_iter().unzip();
            sent.push((indexes, side.delay(&cfg.group, &cfg.topic, &batch).await));
        }
        sent
    }
}

/// Ordered retries: a failure with attempts left parks its key, and the key's records after
/// it in the batch (which the handler did not attempt) park behind it.
fn park_failed_keys(items: &[&Item], decisions: &mut [Decision]) {
    let mut parked: HashSet<(u32, Option<&str>)> = HashSet::new();
    for (item, decision) in items.iter().zip(decisions.iter_mut()) {
        let key = (item.record.partition, item.record.key.as_deref());
        match decision {
            Decision::Retry(f) => {
                *decision = Decision::Park(Some(f.clone()));
                parked.insert(key);
            }
            Decision::Park(_) => {
                parked.insert(key);
            }
            Decision::NotAttempted if parked.contains(&key) => *decision = Decision::Park(None),
            _ => {}
        }
    }
}

/// Parking failed: a failed head is retried in place, the records behind it come again.
fn unpark_all(parks: &[(usize, ParkedRecord)], decisions: &mut [Decision]) {
    for (k, _) in parks {
        if let Some(decision) = decisions.get_mut(*k) {
            *decision = match std::mem::replace(decision, Decision::NotAttempted) {
                Decision::Park(Some(f)) => Decision::Retry(f),
                _ => Decision::NotAttempted,
            };
        }
    }
}

/// The parking row of `item`: a failed head with its attempts and next time, or a record
/// behind it, due as soon as it becomes the head.
fn parked_record(
    worker: &Worker,
    item: &Item,
    failure: Option<&Failure>,
    now_ms: i64,
) -> ParkedRecord {
    let r = &item.record;
    let (attempts, not_before_ms, last_error) = match failure {
        Some(f) => {
            let after = i64::try_from(f.after.as_millis()).unwrap_or(i64::MAX);
            (
                item.attempt,
                now_ms.saturating_add(after),
                Some(f.error.clone()),
            )
        }
        None => (0, now_ms, None),
    };
    ParkedRecord {
        group: worker.config.group.clone(),
        topic: r.topic.clone(),
        partition: r.partition,
        offset: r.offset,
        key: r.key.clone(),
        headers: r.headers.clone(),
        payload: r.payload.clone(),
        attempts,
        not_before_ms,
        last_error,
        parked_at_ms: now_ms,
    }
}
