//! Writing a dead letter: the original record set aside in a dead-letter topic with why, how
//! often it was tried and where it came from, in the headers every reader of entrega's dead
//! letters (`km0 dlq`, [`super::DeadLetter`]) understands.

use entrega_core::headers::{
    INTENTOS, MOTIVO, ORIGIN_GROUP, ORIGIN_OFFSET, ORIGIN_PARTITION, ORIGIN_TOPIC,
};
use entrega_core::{Headers, OutgoingMessage, Record};

/// The headers that say where a dead letter or retry record came from.
pub const ORIGIN_HEADERS: [&str; 4] = [ORIGIN_TOPIC, ORIGIN_PARTITION, ORIGIN_OFFSET, ORIGIN_GROUP];

/// Longest `motivo` header, in bytes; reasons can embed large error texts.
pub const MAX_REASON_BYTES: usize = 1000;

/// Records in `headers` that a message came from `record`, read by consumer `group`.
pub fn set_origin(record: &Record, group: &str, headers: &mut Headers) {
    headers.set(ORIGIN_TOPIC, record.topic.clone());
    headers.set(ORIGIN_PARTITION, record.partition.to_string());
    headers.set(ORIGIN_OFFSET, record.offset.to_string());
    headers.set(ORIGIN_GROUP, group.to_owned());
}

/// The dead letter of `record`, read by `group`, for `dlq_topic`: its payload and key
/// unchanged, its headers plus `intentos` (`attempt`), `motivo` (`reason`, cut to
/// [`MAX_REASON_BYTES`]) and its origin. For a record that already carries an origin (read
/// from a retry topic), see the worker, which keeps the first one.
pub fn dead_letter_of(
    record: &Record,
    group: &str,
    dlq_topic: &str,
    attempt: u32,
    reason: &str,
) -> OutgoingMessage {
    let mut headers = record.headers.clone();
    headers.set(INTENTOS, attempt.to_string());
    headers.set(MOTIVO, truncate(reason, MAX_REASON_BYTES));
    set_origin(record, group, &mut headers);
    OutgoingMessage {
        topic: dlq_topic.to_owned(),
        key: record.key.clone(),
        headers,
        payload: record.payload.clone(),
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
pub(crate) fn truncate(text: &str, max: usize) -> String {
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
    use super::*;

    #[test]
    fn truncates_at_char_boundaries() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("añb", 2), "a");
        assert_eq!(truncate("añb", 3), "añ");
    }

    #[test]
    fn a_dead_letter_keeps_the_record_and_says_why_and_whence() {
        let mut headers = Headers::new();
        headers.set("tipo", "pedido.creado");
        let record = Record {
            topic: "pedidos.eventos".into(),
            partition: 2,
            offset: 41,
            key: Some("P-1".into()),
            headers,
            payload: b"{}".to_vec(),
            timestamp_ms: 0,
        };
        let letter = dead_letter_of(&record, "analitica", "pedidos.eventos.dlq", 1, "esquema");
        assert_eq!(letter.topic, "pedidos.eventos.dlq");
        assert_eq!(letter.key.as_deref(), Some("P-1"));
        assert_eq!(letter.payload, b"{}");
        let h = &letter.headers;
        assert_eq!(h.get("tipo"), Some("pedido.creado"));
        assert_eq!(h.get(INTENTOS), Some("1"));
        assert_eq!(h.get(MOTIVO), Some("esquema"));
        assert_eq!(h.get(ORIGIN_TOPIC), Some("pedidos.eventos"));
        assert_eq!(h.get(ORIGIN_PARTITION), Some("2"));
        assert_eq!(h.get(ORIGIN_OFFSET), Some("41"));
        assert_eq!(h.get(ORIGIN_GROUP), Some("analitica"));
    }
}
