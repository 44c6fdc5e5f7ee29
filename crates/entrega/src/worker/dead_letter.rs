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
