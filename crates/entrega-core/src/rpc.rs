//! The transport seam of request/reply: named request queues any number of servers compete
//! for, and reply queues a requester reads its answers from, matched by correlation id.

use std::time::Duration;

use async_trait::async_trait;

use crate::{Headers, TransportError};

/// A request or a reply as it travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcMessage {
    /// Set by the requester, copied by the server into its reply.
    pub correlation_id: String,
    /// Where the requester waits for the reply (a reply queue's address); `None` on replies,
    /// and on requests that want none.
    pub reply_to: Option<String>,
    /// Further headers (`traceparent`, ...).
    pub headers: Headers,
    /// The body, JSON by convention (`content_type` `application/json`).
    pub payload: Vec<u8>,
    /// Whether the broker keeps it on disk until it is read: durable requests and their
    /// replies. A call whose caller waits in memory does not need it (RabbitMQ then confirms
    /// without writing to disk first).
    pub durable: bool,
}

/// One message taken from a queue, held until it is acknowledged or given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcDelivery {
    /// The message.
    pub message: RpcMessage,
    /// Names this delivery for [`RpcInbox::ack`] and [`RpcInbox::retry`].
    pub tag: u64,
    /// Whether the transport delivered it before (a server died or gave it back).
    pub redelivered: bool,
}

/// Request and reply queues on a transport.
#[async_trait]
pub trait RpcTransport: Send + Sync {
    /// Sends `message` to the queue `queue`: a service's request queue, or a requester's
    /// reply queue (a request's `reply_to`). `Ok` once the transport stored it; a queue
    /// nothing takes (a requester gone with its reply queue) is
    /// [`TransportError::Rejected`]. A request past `expires_in` may be dropped unread.
    async fn send(
        &self,
        queue: &str,
        message: &RpcMessage,
        expires_in: Option<Duration>,
    ) -> Result<(), TransportError>;

    /// Sends a server's answers to a batch, each `(queue, message)` as [`send`](Self::send)
    /// does, without expiry, one result per message in order. By default they are sent one
    /// after the other; a transport that can publish many in one go does. A transport may
    /// take an answer that is not durable as sent once it is on its way, without waiting for
    /// the broker to keep it (RabbitMQ does, as the seed's responder): a lost answer costs
    /// its caller a timeout and a retry, which the stored answer serves. Those that come
    /// back because nothing took them are counted by [`undelivered`](Self::undelivered).
    async fn send_all(&self, messages: &[(&str, &RpcMessage)]) -> Vec<Result<(), TransportError>> {
        let mut results = Vec::with_capacity(messages.len());
        for (queue, message) in messages {
            results.push(self.send(queue, message, None).await);
        }
        results
    }

    /// Answers taken as sent by [`send_all`](Self::send_all) that the transport learned since
    /// the last call nothing took (their requester's reply queue was gone). None by default.
    async fn undelivered(&self) -> u64 {
        0
    }

    /// Reads the durable request queue `queue` (declared if missing) as `consumer`, sharing
    /// its requests with the other consumers of the queue, at most `prefetch` held at once.
    async fn serve(
        &self,
        queue: &str,
        consumer: &str,
        prefetch: u16,
    ) -> Result<Box<dyn RpcInbox>, TransportError>;

    /// Opens a reply queue: with `durable: None` a private one that goes away with its
    /// reader, otherwise the durable queue of that name, which keeps replies while its
    /// reader is down.
    async fn replies(&self, durable: Option<&str>) -> Result<Box<dyn RpcInbox>, TransportError>;
}

/// A queue being read: deliveries come in, each is acknowledged once handled, or given
/// back to be delivered again.
#[async_trait]
pub trait RpcInbox: Send {
    /// The queue's address, for a request's `reply_to`.
    fn address(&self) -> &str;

    /// Waits up to `wait` for up to `max` deliveries. An error means the queue is gone or
    /// unreachable: open it again.
    async fn next(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<RpcDelivery>, TransportError>;

    /// The delivery `tag` was handled: it will not come again.
    async fn ack(&mut self, tag: u64) -> Result<(), TransportError>;

    /// Every delivery of `tags` was handled. By default each is [`ack`](Self::ack)ed in
    /// turn; a transport that can acknowledge many in one go does.
    async fn ack_all(&mut self, tags: &[u64]) -> Result<(), TransportError> {
        for tag in tags {
            self.ack(*tag).await?;
        }
        Ok(())
    }

    /// The delivery `tag` could not be handled now: deliver it again later.
    async fn retry(&mut self, tag: u64) -> Result<(), TransportError>;
}
