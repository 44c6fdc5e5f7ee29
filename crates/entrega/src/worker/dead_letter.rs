//! Dead letters: the original record, set aside in `<topic>.dlq` with why and how often.

use entrega_core::headers::{CLASS, CODE, ORIGIN_TOPIC};
use entrega_core::{DeadReason, OutgoingMessage, Record, TransportError};

use super::{Worker, WorkerConfig};
use crate::dlq::dead_letter_of;

/// The dead letter of `record` ([`dead_letter_of`]). A record read from the retry topic
/// keeps the origin it was given when it left its source topic.
pub(super) fn dead_letter(
    config: &WorkerConfig,
    record: &Record,
    attempt: u32,
    reason: &DeadReason,
) -> OutgoingMessage {
    let from_retry_topic = record.topic == config.retry_topic();
    let mut letter = dead_letter_of(
        record,
        &config.group,
        &config.dlq_topic(),
        attempt,
        &reason.text,
    );
    letter.headers.remove_current(CLASS);
    letter.headers.set(CLASS, reason.class.as_str());
    match &reason.code {
        Some(code) => {
            letter.headers.remove_current(CODE);
            letter.headers.set(CODE, code.clone())
        }
        None => letter.headers.remove_current(CODE),
    }
    if from_retry_topic && record.headers.get(ORIGIN_TOPIC).is_some() {
        for name in crate::dlq::ORIGIN_HEADERS {
            if let Some(value) = record.headers.get(name) {
                letter.headers.set(name, value.to_owned());
            }
        }
    }
    letter
}

/// Where a dead letter came from, for its log line.
pub(super) struct LetterOrigin<'a> {
    pub(super) topic: &'a str,
    pub(super) partition: u32,
    pub(super) offset: i64,
    pub(super) key: Option<&'a str>,
}

/// Counts one dead letter of `group` and says so once at WARN, with where it came from and
/// why: an operator sees dead letters in the logs as they happen, not only in `km0 dlq`.
/// `held`: kept in the database because the dead-letter place refused it.
pub(super) fn dead_lettered(
    group: &str,
    origin: &LetterOrigin<'_>,
    reason: &DeadReason,
    held: bool,
) {
    crate::metrics::dead_letter(group, reason);
    tracing::warn!(
        group,
        topic = origin.topic,
        partition = origin.partition,
        offset = origin.offset,
        key = origin.key.unwrap_or(""),
        class = reason.class.as_str(),
        reason = %reason.text,
        held,
        "dead letter"
    );
}

/// Publishes dead letters and retry records, creating the dead-letter and retry topics first
/// when one is missing and the worker may create topics.
pub(super) async fn publish_set_aside(
    worker: &Worker,
    batch: &[OutgoingMessage],
) -> Result<(), TransportError> {
    let first = worker.publisher.publish(batch).await;
    let Err(TransportError::UnknownTopic { .. }) = &first else {
        return first;
    };
    let Some(admin) = &worker.admin else {
        return first;
    };
    let cfg = &worker.config;
    admin
        .ensure_topic(&cfg.dlq_topic(), cfg.dlq_partitions)
        .await?;
    if batch.iter().any(|m| m.topic == cfg.retry_topic()) {
        admin
            .ensure_topic(&cfg.retry_topic(), cfg.retry_partitions)
            .await?;
    }
    worker.publisher.publish(batch).await
}
