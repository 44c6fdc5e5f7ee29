//! A transport's own places for a consumer group's set-aside messages.

use std::time::Duration;

use async_trait::async_trait;

use crate::{OutgoingMessage, TransportError};

/// Where a transport keeps one consumer group's dead letters and delayed retries itself,
/// instead of the worker publishing them to `<topic>.dlq` and `<topic>.retry`.
///
/// RabbitMQ has both natively: a queue's dead-letter exchange routes to the group's
/// dead-letter queue (the seed's `km0.dlx` → `inventario.pedidos.dlq`), and a wait queue
/// whose messages expire after a TTL dead-letters them back into the group's own queue, so a
/// retry comes back after its backoff with no consumer holding it meanwhile. Log transports
/// have neither and do not implement this trait.
///
/// Both calls are confirmed like [`crate::Publisher::publish`]: `Ok` only once the broker
/// stored every message; on `Err` the caller keeps the originals and tries again.
#[async_trait]
pub trait SideQueues: Send + Sync {
    /// Stores `letters` (each already carrying `intentos` and `motivo`) in the dead-letter
    /// queue of `group` reading `topic`.
    async fn dead_letter(
        &self,
        group: &str,
        topic: &str,
        letters: &[OutgoingMessage],
    ) -> Result<(), TransportError>;

    /// Stores each message so that it is delivered again to `group`'s queue for `topic`
    /// (the same shard as its key) once its delay has passed; a transport may round a delay
    /// up to one of the waits it has, at most doubling it.
    async fn delay(
        &self,
        group: &str,
        topic: &str,
        messages: &[(OutgoingMessage, Duration)],
    ) -> Result<(), TransportError>;
}
