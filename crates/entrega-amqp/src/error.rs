//! lapin's errors as entrega's classified [`TransportError`]s, and AMQP names that cannot
//! overflow.

use entrega_core::TransportError;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::ShortString;
use lapin::ErrorKind;

/// Whether a lapin error may go away by itself: a lost connection, a closed channel, a missed
/// heartbeat or a broker-side hard error is [`TransportError::Unavailable`]; a refusal of
/// this very request (access refused, a declaration that contradicts an existing one, a body
/// too large) is [`TransportError::Rejected`]. A missing exchange or queue is `Rejected`
/// too; callers that know the name turn it into [`TransportError::UnknownTopic`].
pub fn classify(error: lapin::Error) -> TransportError {
    match soft_kind(&error) {
        Some(_) => TransportError::Rejected {
            reason: error.to_string(),
        },
        None => TransportError::unavailable(error),
    }
}

/// The soft AMQP error behind `error`, if it is one.
pub(crate) fn soft_kind(error: &lapin::Error) -> Option<AMQPSoftError> {
    match error.kind() {
        ErrorKind::ProtocolError(e) => match e.kind() {
            AMQPErrorKind::Soft(soft) => Some(soft.clone()),
            AMQPErrorKind::Hard(_) => None,
        },
        _ => None,
    }
}

/// `error`, with a missing exchange or queue named `name` reported as an unknown topic.
pub(crate) fn classify_for(name: &str, error: lapin::Error) -> TransportError {
    if soft_kind(&error) == Some(AMQPSoftError::NOTFOUND) {
        return TransportError::UnknownTopic {
            topic: name.to_owned(),
        };
    }
    classify(error)
}

/// An AMQP short string (exchange, queue, routing key, header name: at most 255 bytes); a
/// longer one is refused, never truncated.
pub(crate) fn short(what: &str, value: &str) -> Result<ShortString, TransportError> {
    ShortString::try_new(value).map_err(|_| TransportError::Rejected {
        reason: format!("{what} `{value}` is longer than AMQP's 255 bytes"),
    })
}
