//! Dead letters: the original record, set aside in `<topic>.dlq` with why and how often.

use entrega_core::headers::{INTENTOS, MOTIVO, ORIGIN_TOPIC};
use entrega_core::{OutgoingMessage, Record, TransportError};

use super::retry::set_origin;
use super::{Worker, WorkerConfig};

/// Longest `motivo` header, in bytes; reasons can embed large error texts.
const MAX_REASON_BYTES: usize = 1000;

/// The dead letter of `record`: its payload and key unchanged, its headers plus `intentos`,
/// `motivo` and where it came from. A record read from the retry topic keeps the origin it
/// was given when it left its source topic.
pub(super) fn dead_letter(
    config: &WorkerConfig,
    record: &Record,
    attempt: u32,
    reason: &str,
) -> OutgoingMessage {
    let mut headers = record.headers.clone();
    headers.set(INTENTOS, attempt.to_string());
    headers.set(MOTIVO, truncate(reason, MAX_REASON_BYTES));
    let from_retry_topic = record.topic == config.retry_topic();
    if !(from_retry_topic && headers.get(ORIGIN_TOPIC).is_some()) {
        set_origin(config, record, &mut headers);
    }
    OutgoingMessage {
        topic: config.dlq_topic(),
        key: record.key.clone(),
        headers,
        payload: record.payload.clone(),
    }
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

/// At most `max` bytes of `text`, cut at a character boundary.
pub(super) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncates_at_char_boundaries() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("añb", 2), "a");
        assert_eq!(truncate("añb", 3), "añ");
    }
}
