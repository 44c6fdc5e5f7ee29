//! One record on its way to an outcome: where it goes, and the decision a handler's result
//! turns into.

use std::time::Duration;

use entrega_core::headers::ONLY_GROUP;
use entrega_core::{DeadClass, DeadReason, Envelope, HandlerError, Record, TRACEPARENT};
use tracing::Instrument as _;

use super::decision::Decision;
use super::panics::{guarded_batch, NoResult};
use super::parked::ParkedKeys;
use super::retry::{delayed_attempts, read_retry_headers, RetryHeaders, Role};
use super::router::{Message, Route};
use super::tracker::Tracker;
use super::{RetryStrategy, Worker};
use crate::failpoint;
use crate::metrics::HANDLER_SECONDS;

/// Where one record goes before any handler runs.
pub(super) enum Target {
    Handler(usize),
    Ignored,
    Dead(DeadReason),
    /// Its outcome became final before a rewind delivered it again.
    Done,
    /// A retry record whose `no_antes` lies this far ahead: held, no attempt counted.
    NotYet(Duration),
    /// Its key is parked (ordered retries): it joins the parked records behind the head.
    Behind,
}

pub(super) struct Item {
    pub(super) record: Record,
    /// The attempt this delivery is: attempts made elsewhere (`base`) plus this member's.
    pub(super) attempt: u32,
    /// Attempts made before the record reached this topic (its `intentos` on a retry topic,
    /// or in the parking store); not counted by the tracker.
    pub(super) base: u32,
    pub(super) target: Target,
    pub(super) message: Option<Message>,
}

impl Item {
    /// The attempt number as the tracker counts it (this member, this topic).
    pub(super) fn local_attempt(&self) -> u32 {
        self.attempt.saturating_sub(self.base)
    }

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
            Target::NotYet(after) => Decision::Wait(*after),
            Target::Behind => Decision::Park(None),
            // A handler's record is decided by the handler.
            Target::Handler(_) => Decision::NotAttempted,
        }
    }
}

/// What [`prepare`] needs to know about the session a record arrived in.
pub(super) struct Context<'a> {
    pub(super) worker: &'a Worker,
    pub(super) tracker: &'a Tracker,
    pub(super) role: Role,
    /// Parked keys (ordered retries); `None` when the strategy parks nothing.
    pub(super) parked: Option<&'a ParkedKeys>,
    pub(super) now_ms: i64,
}

/// How long a record of a partition whose parked keys could not be loaded waits.
const UNLOADED_WAIT: Duration = Duration::from_secs(1);

/// Parses `record` and picks its target; the context gives the attempt number, knows the
/// records already done and the parked keys, and reads a retry record's schedule.
pub(super) fn prepare(ctx: &Context<'_>, record: Record) -> Item {
    let local = ctx.tracker.attempt(record.partition, record.offset);
    let mut item = Item {
        attempt: local,
        base: 0,
        target: Target::Done,
        message: None,
        record,
    };
    if ctx
        .tracker
        .is_done(item.record.partition, item.record.offset)
    {
        return item;
    }
    // A replay aimed at another group (`entrega-only-group`, signed with the replay key):
    // acknowledged, never handled, not even parsed, so it cannot be dead-lettered here either.
    if solo_for_another_group(ctx.worker, &item.record) {
        item.target = Target::Ignored;
        return item;
    }
    if let Some(parked) = ctx.parked {
        match parked.contains(item.record.partition, item.record.key.as_deref()) {
            Some(true) => {
                item.target = Target::Behind;
                return item;
            }
            Some(false) => {}
            None => {
                item.target = Target::NotYet(UNLOADED_WAIT);
                return item;
            }
        }
    }
    if ctx.role == Role::Source && ctx.worker.config.retry == RetryStrategy::DelayQueues {
        if let Some(attempts) = delayed_attempts(&item.record, &ctx.worker.config.group) {
            item.base = attempts;
            item.attempt = attempts.saturating_add(local);
        }
    }
    if ctx.role == Role::Retry {
        match read_retry_headers(&item.record, &ctx.worker.config.group) {
            RetryHeaders::OtherGroup => {
                item.target = Target::Ignored;
                return item;
            }
            RetryHeaders::Malformed(reason) => {
                item.target = Target::Dead(DeadReason::new(DeadClass::BadRetryHeaders, reason));
                return item;
            }
            RetryHeaders::Valid {
                attempts,
                not_before_ms,
            } => {
                item.base = attempts;
                item.attempt = attempts.saturating_add(local);
                if not_before_ms > ctx.now_ms {
                    let wait = u64::try_from(not_before_ms - ctx.now_ms).unwrap_or(0);
                    item.target = Target::NotYet(Duration::from_millis(wait));
                    return item;
                }
            }
        }
    }
    route(ctx.worker, &mut item);
    item
}

/// Parses the envelope of a record due for handling and picks its handler.
pub(super) fn route(worker: &Worker, item: &mut Item) {
    let envelope = match Envelope::parse_with(&item.record.payload, &worker.config.limits) {
        Ok(envelope) => envelope,
        Err(e) => {
            item.target = Target::Dead(DeadReason::new(DeadClass::Unreadable, e.to_string()));
            return;
        }
    };
    item.target = match worker.router.resolve(&envelope.kind) {
        Route::Handler(index) => Target::Handler(index),
        Route::Ignored => Target::Ignored,
        Route::Unknown => Target::Dead(DeadReason::new(
            DeadClass::UnknownType,
            format!("unknown tipo `{}`", envelope.kind),
        )),
    };
    let record = &item.record;
    item.message = matches!(item.target, Target::Handler(_)).then(|| Message {
        envelope,
        topic: record.topic.clone(),
        partition: record.partition,
        offset: record.offset,
        key: record.key.clone(),
        headers: record.headers.clone(),
        attempt: item.attempt,
        trace: crate::trace::continued(record.headers.get(TRACEPARENT)),
    });
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
    let started = std::time::Instant::now();
    let group = worker.config.group.as_str();
    let mut msgs = msgs;
    let spans: Vec<tracing::Span> = msgs
        .iter_mut()
        .map(|m| {
            let span = message_span(group, m);
            m.trace = crate::trace::open(&span, crate::trace::carried(&m.headers));
            span
        })
        .collect();
    let call = guarded_batch(handler.as_ref(), &msgs, worker.config.handler_timeout);
    let mut results = match spans.as_slice() {
        [one] => call.instrument(one.clone()).await,
        _ => {
            call.instrument(tracing::info_span!("batch", group, messages = msgs.len()))
                .await
        }
    };
    drop(spans);
    metrics::histogram!(HANDLER_SECONDS, "group" => worker.config.group.clone())
        .record(started.elapsed().as_secs_f64());
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
                Decision::retry(cfg.backoff.delay(msg.attempt), e.inner())
            }
            Some(Err(e)) if e.is_transient() => Decision::Dead(DeadReason {
                class: DeadClass::Exhausted,
                code: e.code().map(str::to_owned),
                text: format!(
                    "transient exhausted after {} attempts: {}",
                    msg.attempt,
                    e.inner()
                ),
            }),
            Some(Err(e)) => Decision::Dead(DeadReason {
                class: e.dead_class(),
                code: e.code().map(str::to_owned),
                text: e.to_string(),
            }),
        })
        .collect()
}

/// The span of one delivery, named for what it does, with the trace fields of
/// [`crate::trace`] (filled by [`crate::trace::open`]): open while its handler call runs.
/// Field values are only computed when a subscriber wants the span.
fn message_span(group: &str, msg: &Message) -> tracing::Span {
    tracing::info_span!(
        "consume",
        otel.name = %format!("consume {}", msg.kind()),
        otel.kind = "consumer",
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        group,
        topic = %msg.topic,
        partition = msg.partition,
        offset = msg.offset,
        id_evento = %msg.envelope.id,
        attempt = msg.attempt,
    )
}

/// Whether `record` is a replay meant for another group only: its `entrega-only-group` names
/// another group and its signature verifies with the worker's replay key. A header without a
/// valid signature, or any header when the worker has no key, is ignored (and counted): the
/// record is handled as any other, so nobody who can publish can make a consumer skip one.
fn solo_for_another_group(worker: &Worker, record: &Record) -> bool {
    if record.headers.get_current(ONLY_GROUP).is_none() {
        return false;
    }
    let cfg = &worker.config;
    let verified = cfg
        .replay_key
        .as_ref()
        .and_then(|key| key.solo_group(&record.headers, record.key.as_deref(), &record.payload));
    match verified {
        Some(Ok(group)) => group != cfg.group,
        _ => {
            crate::metrics::unsigned_only_group(&cfg.group);
            tracing::warn!(
                topic = %record.topic,
                partition = record.partition,
                offset = record.offset,
                "entrega-only-group without a valid signature; handling the record as any other"
            );
            false
        }
    }
}
