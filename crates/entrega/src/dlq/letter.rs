//! A dead letter as operators see it: the record of `<topic>.dlq` read through its headers,
//! with what an operator already did to it.

use entrega_core::headers::{
    CLASS, CODE, ID_EVENTO, INTENTOS, MOTIVO, ORIGIN_GROUP, ORIGIN_OFFSET, ORIGIN_PARTITION,
    ORIGIN_TOPIC, REPLAYS, TIPO,
};
use entrega_core::{DeadClass, DeadLetterId, DeadLetterMark, DeadLetterState, Headers, Record};
use serde::Serialize;

/// Where a dead letter was consumed from before it was set aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    /// The topic it was read from: `entrega-origin-topic`, or the dead-letter topic's name
    /// without `.dlq` when a producer other than entrega's worker left the header out.
    pub topic: String,
    /// Its partition there, when known.
    pub partition: Option<u32>,
    /// Its offset there, when known.
    pub offset: Option<i64>,
    /// The consumer group that dead-lettered it, when known.
    pub group: Option<String>,
}

/// One record of a dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Where it sits.
    pub id: DeadLetterId,
    /// The original key.
    pub key: Option<String>,
    /// The event type (`tipo` header, else the envelope's `tipo`).
    pub kind: Option<String>,
    /// Why it was dead-lettered (`motivo`); empty when missing.
    pub reason: String,
    /// The kind of failure (`entrega-class`), when the worker that wrote it recorded one.
    pub failure: Option<DeadClass>,
    /// The handler's code for the refusal (`entrega-code`), when it gave one.
    pub code: Option<String>,
    /// Delivery attempts made (`intentos`), when recorded.
    pub attempts: Option<u32>,
    /// Times it was replayed before this dead letter (`entrega-replays`, 0 when absent).
    pub replays: u32,
    /// The event id (`id_evento` header), which idempotent consumers deduplicate by.
    pub event_id: Option<String>,
    /// Where it came from.
    pub origin: Origin,
    /// When it was written to the dead-letter topic (epoch ms).
    pub timestamp_ms: i64,
    /// What an operator did to it; `None` while pending.
    pub mark: Option<DeadLetterMark>,
    /// Every header as written.
    pub headers: Headers,
    /// The original payload, unchanged.
    pub payload: Vec<u8>,
}

impl DeadLetter {
    /// Reads a dead-letter record.
    pub fn from_record(record: Record) -> Self {
        let h = &record.headers;
        let kind = h
            .get(TIPO)
            .map(str::to_owned)
            .or_else(|| envelope_tipo(&record.payload));
        let origin = Origin {
            topic: h.get(ORIGIN_TOPIC).map_or_else(
                || {
                    let t = &record.topic;
                    t.strip_suffix(".dlq").unwrap_or(t).to_owned()
                },
                str::to_owned,
            ),
            partition: h.get(ORIGIN_PARTITION).and_then(|p| p.parse().ok()),
            offset: h.get(ORIGIN_OFFSET).and_then(|o| o.parse().ok()),
            group: h.get(ORIGIN_GROUP).map(str::to_owned),
        };
        Self {
            id: DeadLetterId::new(record.topic.clone(), record.partition, record.offset),
            key: record.key.clone(),
            kind,
            reason: h.get(MOTIVO).unwrap_or_default().to_owned(),
            failure: h.get_current(CLASS).and_then(DeadClass::parse),
            code: h.get_current(CODE).map(str::to_owned),
            attempts: h.get(INTENTOS).and_then(|a| a.trim().parse().ok()),
            replays: h
                .get_current(REPLAYS)
                .and_then(|r| r.trim().parse().ok())
                .unwrap_or(0),
            event_id: h.get(ID_EVENTO).map(str::to_owned),
            origin,
            timestamp_ms: record.timestamp_ms,
            mark: None,
            headers: record.headers,
            payload: record.payload,
        }
    }

    /// `pending`, `replayed` or `discarded`.
    pub fn state(&self) -> &'static str {
        self.mark.as_ref().map_or("pending", |m| m.state.as_str())
    }

    /// Whether no operator has acted on it yet.
    pub fn is_pending(&self) -> bool {
        self.mark.is_none()
    }

    /// Whether an operator replayed it.
    pub fn is_replayed(&self) -> bool {
        self.mark
            .as_ref()
            .is_some_and(|m| m.state == DeadLetterState::Replayed)
    }

    /// The class of its reason: see [`reason_class`].
    pub fn class(&self) -> &str {
        reason_class(&self.reason)
    }

    /// The payload as JSON when it is JSON (an envelope), else as text.
    pub fn payload_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.payload).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&self.payload).into_owned())
        })
    }
}

/// The class of a reason, for grouping: the text before the first `:` or backquote, trimmed
/// (`producto desconocido: queso-azul` → `producto desconocido`, ``unknown tipo `x` `` →
/// `unknown tipo`). When that text is the worker's classification (`permanent`,
/// `transient exhausted after N attempts`), the next segment is kept with it
/// (`permanent: producto desconocido: queso-azul` → `permanent: producto desconocido`).
/// The whole reason when it has neither; `(none)` when empty.
pub fn reason_class(reason: &str) -> &str {
    let cut = |text: &str| text.find([':', '`']).unwrap_or(text.len());
    let first = cut(reason);
    let head = reason[..first].trim();
    let classified = head == "permanent" || head.starts_with("transient");
    let end = match reason[first..].strip_prefix(':') {
        Some(rest) if classified => first + 1 + cut(rest),
        _ => first,
    };
    let class = reason[..end].trim();
    if class.is_empty() {
        "(none)"
    } else {
        class
    }
}

/// The `tipo` of a payload that is an envelope.
fn envelope_tipo(payload: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    value.get("tipo")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::reason_class;

    #[test]
    fn classes_cut_at_the_first_colon_or_backquote() {
        assert_eq!(
            reason_class("producto desconocido: queso"),
            "producto desconocido"
        );
        assert_eq!(reason_class("unknown tipo `pedido.x`"), "unknown tipo");
        assert_eq!(
            reason_class("transient exhausted after 3 attempts: timeout"),
            "transient exhausted after 3 attempts: timeout"
        );
        assert_eq!(reason_class("sin stock"), "sin stock");
        assert_eq!(
            reason_class("permanent: producto desconocido: queso"),
            "permanent: producto desconocido"
        );
        assert_eq!(
            reason_class("transient exhausted after 3 attempts: timeout: 5s"),
            "transient exhausted after 3 attempts: timeout"
        );
        assert_eq!(reason_class("permanent"), "permanent");
        assert_eq!(reason_class(""), "(none)");
        assert_eq!(reason_class(": x"), "(none)");
    }
}
