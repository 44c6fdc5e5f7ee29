//! Where a transiently failing message waits for its next attempt, and the retry topic's
//! wire form (the seed's `<topic>.retry` with `intentos`, `no_antes`, `ultimo_error`).

use std::time::Duration;

use entrega_core::headers::{INTENTOS, NO_ANTES, ORIGIN_GROUP, ULTIMO_ERROR};
use entrega_core::{OutgoingMessage, Record};

use super::WorkerConfig;
use crate::dlq::truncate;

/// Longest `ultimo_error` header, in bytes (the seed keeps 200 characters; errors that name
/// a row or a field need a little more).
const MAX_ERROR_BYTES: usize = 500;

/// How a subscription retries a message that failed transiently with attempts left.
///
/// Permanent failures, malformed envelopes and exhausted attempts go to `<topic>.dlq` under
/// every strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RetryStrategy {
    /// The partition is rewound to the message and paused for the backoff: strict partition
    /// order, at the price of every later message of the partition waiting.
    #[default]
    InPlace,
    /// The seed's design: the message goes to `<topic>.retry` with `intentos`, `no_antes`
    /// and `ultimo_error`, and its source offset becomes final, so the partition never
    /// waits. The same worker reads the retry topic, holds each record until its
    /// `no_antes`, and tries it again. A retried message loses its place: a later message
    /// of the same key may be applied first.
    RetryTopic,
    /// RabbitMQ's way, through the transport's [`entrega_core::SideQueues`]: the message
    /// goes to a wait queue with `intentos` and `ultimo_error`, and its delivery becomes
    /// final, so the queue never waits and no consumer holds the message meanwhile; the
    /// broker delivers it again into the group's own queue (its key's shard) once the backoff
    /// has passed, and the attempts are read back from `intentos`. Like the retry topic, a
    /// retried message loses its place. Needs [`crate::Worker::with_side_queues`].
    DelayQueues,
    /// Per-key order without blocking the partition: when a message of key K fails, K is
    /// parked (the message and every later one of K, in order, in a [`entrega_core::ParkingStore`])
    /// until its head succeeds or is dead-lettered; other keys keep flowing.
    Ordered,
}

/// Which topic a session reads: the subscription's own, or its retry topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Source,
    Retry,
}

/// What the retry topic's headers say about a record.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RetryHeaders {
    /// Attempts already made, and the earliest time of the next one (epoch ms).
    Valid { attempts: u32, not_before_ms: i64 },
    /// The record belongs to another consumer group's retries.
    OtherGroup,
    /// A header cannot be read; the record cannot be scheduled.
    Malformed(String),
}

/// Reads `intentos`, `no_antes` and the origin group of a retry record. A record without an
/// origin group (written by a seed-style service) belongs to every group.
pub(super) fn read_retry_headers(record: &Record, group: &str) -> RetryHeaders {
    let headers = &record.headers;
    if headers.get(ORIGIN_GROUP).is_some_and(|g| g != group) {
        return RetryHeaders::OtherGroup;
    }
    let attempts = match headers.get(INTENTOS).map(str::trim) {
        None => 0,
        Some(text) => match text.parse::<u32>() {
            Ok(n) => n,
            Err(_) => return RetryHeaders::Malformed(format!("header `{INTENTOS}` is `{text}`")),
        },
    };
    let not_before_ms = match headers.get(NO_ANTES).map(str::trim) {
        None => 0,
        Some(text) => match text.parse::<f64>() {
            Ok(secs) if secs.is_finite() => (secs * 1000.0) as i64,
            _ => return RetryHeaders::Malformed(format!("header `{NO_ANTES}` is `{text}`")),
        },
    };
    RetryHeaders::Valid {
        attempts,
        not_before_ms,
    }
}

/// The attempts already made on a record that came back from this group's delay queues:
/// its `intentos`, when its origin group is `group`. Anything else (a first delivery, another
/// group's retry, a header that does not read) counts from zero.
pub(super) fn delayed_attempts(record: &Record, group: &str) -> Option<u32> {
    let headers = &record.headers;
    if headers.get(ORIGIN_GROUP) != Some(group) {
        return None;
    }
    headers.get(INTENTOS)?.trim().parse().ok()
}

/// The retry-topic record for `record` after failed attempt number `attempt`: key and
/// payload unchanged; `intentos`, `no_antes` (epoch seconds as float text) and `ultimo_error`
/// set; the origin kept from a record that already came through the retry topic.
pub(super) fn retry_message(
    config: &WorkerConfig,
    record: &Record,
    role: Role,
    attempt: u32,
    now_ms: i64,
    after: Duration,
    error: &str,
) -> OutgoingMessage {
    let mut headers = record.headers.clone();
    let due_ms = now_ms.saturating_add(i64::try_from(after.as_millis()).unwrap_or(i64::MAX));
    headers.set(INTENTOS, attempt.to_string());
    headers.set(NO_ANTES, format!("{:.3}", due_ms as f64 / 1000.0));
    headers.set(ULTIMO_ERROR, truncate(error, MAX_ERROR_BYTES));
    if role == Role::Source {
        crate::dlq::set_origin(record, &config.group, &mut headers);
    }
    OutgoingMessage {
        topic: config.retry_topic(),
        key: record.key.clone(),
        headers,
        payload: record.payload.clone(),
    }
}

#[cfg(test)]
mod tests {
    use entrega_core::Headers;

    use super::*;
    use entrega_core::headers::{ORIGIN_OFFSET, ORIGIN_TOPIC};

    fn record(headers: Headers) -> Record {
        Record {
            topic: "t.retry".into(),
            partition: 0,
            offset: 4,
            key: Some("k".into()),
            headers,
            payload: b"{}".to_vec(),
            timestamp_ms: 0,
        }
    }

    #[test]
    fn reads_the_seed_headers() {
        let r = record(
            Headers::new()
                .with(INTENTOS, "2")
                .with(NO_ANTES, "1700000000.25"),
        );
        assert_eq!(
            read_retry_headers(&r, "g"),
            RetryHeaders::Valid {
                attempts: 2,
                not_before_ms: 1_700_000_000_250
            }
        );
    }

    #[test]
    fn other_groups_and_bad_headers_are_told_apart() {
        let other = record(Headers::new().with(ORIGIN_GROUP, "other"));
        assert_eq!(read_retry_headers(&other, "g"), RetryHeaders::OtherGroup);
        let mine = record(Headers::new().with(ORIGIN_GROUP, "g"));
        assert!(matches!(
            read_retry_headers(&mine, "g"),
            RetryHeaders::Valid { attempts: 0, .. }
        ));
        let bad = record(Headers::new().with(INTENTOS, "dos"));
        assert!(matches!(
            read_retry_headers(&bad, "g"),
            RetryHeaders::Malformed(m) if m.contains("intentos")
        ));
        let bad = record(Headers::new().with(NO_ANTES, "NaN"));
        assert!(matches!(
            read_retry_headers(&bad, "g"),
            RetryHeaders::Malformed(_)
        ));
    }

    #[test]
    fn delayed_attempts_are_read_only_from_this_groups_retries() {
        let mine = record(Headers::new().with(ORIGIN_GROUP, "g").with(INTENTOS, "2"));
        assert_eq!(delayed_attempts(&mine, "g"), Some(2));
        assert_eq!(delayed_attempts(&mine, "other"), None);
        let fresh = record(Headers::new().with(INTENTOS, "2"));
        assert_eq!(delayed_attempts(&fresh, "g"), None);
        let bad = record(Headers::new().with(ORIGIN_GROUP, "g").with(INTENTOS, "dos"));
        assert_eq!(delayed_attempts(&bad, "g"), None);
    }

    #[test]
    fn retry_messages_carry_the_schedule_and_the_origin() {
        let config = WorkerConfig::new("g", "t");
        let mut source = record(Headers::new().with("tipo", "x"));
        source.topic = "t".into();
        let m = retry_message(
            &config,
            &source,
            Role::Source,
            1,
            1_000,
            Duration::from_millis(1500),
            "boom",
        );
        assert_eq!(m.topic, "t.retry");
        assert_eq!(m.key.as_deref(), Some("k"));
        assert_eq!(m.headers.get(INTENTOS), Some("1"));
        assert_eq!(m.headers.get(NO_ANTES), Some("2.500"));
        assert_eq!(m.headers.get(ULTIMO_ERROR), Some("boom"));
        assert_eq!(m.headers.get(ORIGIN_TOPIC), Some("t"));
        assert_eq!(m.headers.get(ORIGIN_GROUP), Some("g"));
        assert_eq!(m.headers.get("tipo"), Some("x"));
        // A second trip keeps the first origin.
        let again = record(m.headers.clone());
        let m2 = retry_message(&config, &again, Role::Retry, 2, 0, Duration::ZERO, "b2");
        assert_eq!(m2.headers.get(ORIGIN_TOPIC), Some("t"));
        assert_eq!(m2.headers.get(ORIGIN_OFFSET), Some("4"));
        assert_eq!(m2.headers.get(INTENTOS), Some("2"));
    }
}
