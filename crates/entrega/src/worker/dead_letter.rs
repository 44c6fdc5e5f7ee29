//! Dead letters: the original record, set aside in `<topic>.dlq` with why and how often.

use entrega_core::headers::{
    INTENTOS, MOTIVO, ORIGIN_GROUP, ORIGIN_OFFSET, ORIGIN_PARTITION, ORIGIN_TOPIC,
};
use entrega_core::{OutgoingMessage, Record, TransportError};

use super::{Worker, WorkerConfig};

/// Longest `motivo` header, in bytes; reasons can embed large error texts.
const MAX_REASON_BYTES: usize = 1000;

/// The dead letter of `record`: its payload and key unchanged, its headers plus `intentos`,
/// `motivo` and where it came from.
pub(super) fn dead_letter(
    config: &WorkerConfig,
    record: &Record,
    attempt: u32,
    reason: &str,
) -> OutgoingMessage {
    let mut headers = record.headers.clone();
    headers.set(INTENTOS, attempt.to_string());
    headers.set(MOTIVO, truncate(reason, MAX_REASON_BYTES));
    headers.set(ORIGIN_TOPIC, record.topic.clone());
    headers.set(ORIGIN_PARTITION, record.partition.to_string());
    headers.set(ORIGIN_OFFSET, record.offset.to_string());
    headers.set(ORIGIN_GROUP, config.group.clone());
    OutgoingMessage {
        topic: config.dlq_topic(),
        key: record.key.clone(),
        headers,
        payload: record.payload.clone(),
    }
}

/// Publishes dead letters, creating the dead-letter topic first when it is missing and the
/// worker may create topics.
pub(super) async fn publish_dead_letters(
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
    worker.publisher.publish(batch).await
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
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
