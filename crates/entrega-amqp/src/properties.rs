//! An [`OutgoingMessage`]'s headers and identity as AMQP properties, and back.

use entrega_core::headers::ID_EVENTO;
use entrega_core::{Headers, TransportError};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;

use crate::error::short;

/// The header that carries a message's partitioning key: AMQP routes by the shard, so the
/// key itself travels beside the message's own headers (and is taken off them on delivery).
pub const KEY_HEADER: &str = "entrega-key";

/// Persistent (`delivery_mode` 2), `application/json`, the headers as AMQP string headers
/// (the key, if any, in [`KEY_HEADER`]), and `message_id` set to `id_evento` when the
/// message has one.
pub(crate) fn properties_of(
    headers: &Headers,
    key: Option<&str>,
) -> Result<BasicProperties, TransportError> {
    let mut table = FieldTable::default();
    if let Some(key) = key {
        table.insert(
            short("header name", KEY_HEADER)?,
            AMQPValue::LongString(LongString::from(key.as_bytes().to_vec())),
        );
    }
    for (name, value) in headers.iter() {
        table.insert(
            short("header name", name)?,
            AMQPValue::LongString(LongString::from(value.as_bytes().to_vec())),
        );
    }
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(short("content type", "application/json")?)
        .with_headers(table);
    if let Some(id) = headers.get(ID_EVENTO) {
        properties = properties.with_message_id(short("message id", id)?);
    }
    Ok(properties)
}

/// The headers of a delivered message: every AMQP header but [`KEY_HEADER`], in name order
/// (RabbitMQ's own `x-` headers included); values that are not strings are written as their
/// text.
pub fn delivery_headers(properties: &BasicProperties) -> Headers {
    let mut headers = Headers::new();
    if let Some(table) = properties.headers() {
        for (name, value) in table.inner() {
            if name.as_str() == KEY_HEADER {
                continue;
            }
            let text = match value {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                AMQPValue::ShortString(s) => s.as_str().to_owned(),
                other => format!("{other:?}"),
            };
            headers.push(name.as_str(), text);
        }
    }
    headers
}

/// The partitioning key of a delivered message ([`KEY_HEADER`]), if it had one.
pub fn delivery_key(properties: &BasicProperties) -> Option<String> {
    match properties.headers().as_ref()?.inner().get(KEY_HEADER)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_the_event_id_is_the_message_id() {
        let headers = Headers::new()
            .with("tipo", "pedido.creado")
            .with(ID_EVENTO, "0b8f6f3e-0000-4000-8000-000000000001");
        let properties = properties_of(&headers, Some("P-1")).unwrap();
        assert_eq!(
            properties.message_id().as_ref().map(|m| m.as_str()),
            Some("0b8f6f3e-0000-4000-8000-000000000001")
        );
        assert_eq!(properties.delivery_mode(), &Some(2));
        let back = delivery_headers(&properties);
        assert_eq!(back.get("tipo"), Some("pedido.creado"));
        assert_eq!(back.len(), 2, "the key travels apart from the headers");
        assert_eq!(delivery_key(&properties).as_deref(), Some("P-1"));
        assert_eq!(delivery_key(&properties_of(&headers, None).unwrap()), None);
        let long = "x".repeat(300);
        assert!(properties_of(&Headers::new().with(long, "v"), None).is_err());
    }
}
