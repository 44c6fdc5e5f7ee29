//! One record on its way to an outcome: where it goes, and the decision a handler's result
//! turns into.

use std::time::Duration;

use entrega_core::headers::SOLO_GRUPO;
use entrega_core::{Envelope, HandlerError, Record};

use super::panics::{guarded_batch, NoResult};
use super::router::{Message, Route};
use super::tracker::Tracker;
use super::Worker;
use crate::failpoint;

/// Where one record goes before any handler runs.
pub(super) enum Target {
    Handler(usize),
    Ignored,
    Dead(String),
    /// Its outcome became final before a rewind delivered it again.
    Done,
}

pub(super) struct Item {
    pub(super) record: Record,
    pub(super) attempt: u32,
    pub(super) target: Target,
    pub(super) message: Option<Message>,
}

impl Item {
    /// The handler this record goes to, if any.
    pub(super) fn handler(&self) -> Option<usize> {
        match self.target {
            Target::Handler(index) => Some(index),
            _ => None,
        }
    }

    /// The decision for a record no handler runs.
    pub(super) fn decide_alone(&self) -> Decision {
        match &self.target {
            Target::Ignored => Decision::Ignore,
            Target::Dead(reason) => Decision::Dead(reason.clone()),
            Target::Done => Decision::Skip,
            // A handler's record is decided by the handler.
            Target::Handler(_) => Decision::NotAttempted,
        }
    }
}

/// The outcome of one record, before it is applied to offsets and positions.
pub(super) enum Decision {
    Ack,
    Ignore,
    Dead(String),
    /// Already final before this delivery: nothing to do, nothing to count again.
    Skip,
    Retry(Duration),
    NotAttempted,
}

impl Decision {
    /// Whether later records of the same partition (or key) must wait: they come again in
    /// order.
    pub(super) fn blocks(&self) -> bool {
        matches!(self, Self::Retry(_) | Self::NotAttempted)
    }
}

/// Parses `record` and picks its target; `tracker` gives the attempt number and knows the
/// records already done.
pub(super) fn prepare(worker: &Worker, tracker: &Tracker, record: Record) -> Item {
    let attempt = tracker.attempt(record.partition, record.offset);
    if tracker.is_done(record.partition, record.offset) {
        return Item {
            record,
            attempt,
            target: Target::Done,
            message: None,
        };
    }
    // A replay aimed at another group (`entrega-solo-grupo`): acknowledged, never handled,
    // not even parsed, so it cannot be dead-lettered here either.
    if record
        .headers
        .get(SOLO_GRUPO)
        .is_some_and(|only| only != worker.config.group)
    {
        return Item {
            record,
            attempt,
            target: Target::Ignored,
            message: None,
        };
    }
    let envelope = match Envelope::parse_with(&record.payload, &worker.config.limits) {
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
    let target = match worker.router.resolve(&envelope.kind) {
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

/// Hands `msgs` to handler `index` as one batch and classifies the results, one decision per
/// message.
pub(super) async fn run_handler(
    worker: &Worker,
    index: usize,
    msgs: Vec<Message>,
) -> Vec<Decision> {
    let Some(handler) = worker.router.handler(index) else {
        return msgs.iter().map(|_| Decision::NotAttempted).collect();
    };
    let _in_flight = worker.stats.enter();
    let mut results = guarded_batch(handler.as_ref(), &msgs).await;
    if let Err(e) = failpoint::hit(failpoint::WORKER_AFTER_HANDLER) {
        results = vec![Err(HandlerError::transient(e))];
    }
    if results.is_empty() && !msgs.is_empty() {
        // Treated as a failure of the first message, or the batch would spin forever.
        results.push(Err(HandlerError::transient(NoResult)));
    }
    let cfg = &worker.config;
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
