//! What RabbitMQ cannot show: a queue is not a log. It keeps no offsets once a message is
//! acked, has no committed position per group, and cannot read back a consumed message, so
//! the log inspector's questions get a clear refusal instead of made-up numbers.

use async_trait::async_trait;
use entrega_core::{LogInspector, Record, TransportError};

/// [`LogInspector`] on RabbitMQ: every read is refused with the reason (RabbitMQ has no
/// offsets to show); queue depths are a different question, for the queue-level tools.
#[derive(Debug, Clone, Copy, Default)]
pub struct AmqpInspector;

fn no_offsets(what: &str) -> TransportError {
    TransportError::Rejected {
        reason: format!(
            "RabbitMQ has no {what}: a queue forgets a message once it is acked, and keeps no \
             offsets to replay from"
        ),
    }
}

#[async_trait]
impl LogInspector for AmqpInspector {
    async fn end_offsets(&self, _topic: &str) -> Result<Vec<(u32, i64)>, TransportError> {
        Err(no_offsets("end offsets"))
    }

    async fn committed(
        &self,
        _group: &str,
        _topic: &str,
    ) -> Result<Vec<(u32, i64)>, TransportError> {
        Err(no_offsets("committed offsets"))
    }

    async fn read(
        &self,
        _topic: &str,
        _partition: u32,
        _from: i64,
        _max: usize,
    ) -> Result<Vec<Record>, TransportError> {
        Err(no_offsets("records to read back by offset"))
    }
}
