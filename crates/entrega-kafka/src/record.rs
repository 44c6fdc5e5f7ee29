//! Turning a fetched Kafka message into an owned [`Record`].

use entrega_core::{Headers, Record};
use rdkafka::message::{BorrowedMessage, Headers as _, Message};

/// Copies a message out of librdkafka's buffers. Keys and header values are text in entrega's
/// wire contract; bytes that are not UTF-8 are replaced rather than rejected, and a null header
/// value reads as empty.
pub(crate) fn to_record(m: &BorrowedMessage<'_>) -> Option<Record> {
    let partition = u32::try_from(m.partition()).ok()?;
    let headers: Headers = m
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    let value = h
                        .value
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default();
                    (h.key.to_owned(), value)
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Record {
        topic: m.topic().to_owned(),
        partition,
        offset: m.offset(),
        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        headers,
        payload: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
    })
}
