//! Request/reply on RabbitMQ as the seed's section 4 does it: requests are published through
//! the default exchange to the service's durable queue (`pagos.autorizaciones`) with
//! `reply_to`, `correlation_id` and `content_type` `application/json`; replies go the same way
//! to the requester's queue. Every message is `mandatory`. Requests and durable answers are
//! confirmed, so a request to a queue nobody declared fails as [`TransportError::Rejected`]
//! instead of vanishing, and a durable answer is kept before its request is acknowledged.
//! The answer to a transient request goes unconfirmed, as the seed's responder sends it: it
//! counts as sent once written (its request is acknowledged without waiting a round trip
//! for the broker's confirm, which held a place of the prefetch window meanwhile); one the
//! broker returns because its requester's queue is gone is counted by
//! [`RpcTransport::undelivered`], and one lost with a failing broker costs its caller a
//! timeout and a retry, answered from the stored answer.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use entrega_core::{RpcDelivery, RpcInbox, RpcMessage, RpcTransport, TransportError};
use futures::{FutureExt as _, StreamExt as _};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Consumer};

use crate::error::{classify, classify_for, short};
use crate::link::{Amqp, Kind};
use crate::properties::{delivery_headers, properties_of};
use crate::publisher::{AmqpPublisher, Outgoing};

/// [`RpcTransport`] on RabbitMQ.
pub struct AmqpRpc {
    amqp: Amqp,
    /// Requests and durable answers: confirmed.
    publisher: AmqpPublisher,
    /// Answers to transient requests: unconfirmed.
    transient: AmqpPublisher,
}

impl std::fmt::Debug for AmqpRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpRpc").finish_non_exhaustive()
    }
}

impl AmqpRpc {
    /// Request/reply on `amqp`'s connection, publishing on a confirm channel of its own (and
    /// transient answers on another, unconfirmed).
    pub fn new(amqp: Amqp) -> Self {
        Self {
            publisher: AmqpPublisher::new(amqp.clone()),
            transient: AmqpPublisher::unconfirmed(amqp.clone()),
            amqp,
        }
    }

    /// A channel consuming `queue`: with manual acks and at most `prefetch` unacked, or,
    /// with `no_ack`, every delivery acknowledged by the broker as it is sent (a private reply
    /// queue, whose replies are lost with its reader anyway, as the seed's `auto_ack=True`).
    async fn consume(
        &self,
        channel: Channel,
        queue: String,
        consumer: &str,
        prefetch: u16,
        no_ack: bool,
    ) -> Result<Box<dyn RpcInbox>, TransportError> {
        if !no_ack {
            channel
                .basic_qos(prefetch.max(1), BasicQosOptions { global: false })
                .await
                .map_err(classify)?;
        }
        let stream = channel
            .basic_consume(
                short("queue", &queue)?,
                short("consumer tag", consumer)?,
                BasicConsumeOptions {
                    no_ack,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| classify_for(&queue, e))?;
        Ok(Box::new(AmqpRpcInbox {
            address: self.amqp.local(&queue).to_owned(),
            channel,
            stream,
            no_ack,
            open: BTreeSet::new(),
            handled: BTreeSet::new(),
            hold_max: usize::from(prefetch / 4).max(1),
        }))
    }
}

#[async_trait]
impl RpcTransport for AmqpRpc {
    async fn send(
        &self,
        queue: &str,
        message: &RpcMessage,
        expires_in: Option<Duration>,
    ) -> Result<(), TransportError> {
        let queue = self.amqp.wire(Kind::Queue, queue);
        self.publisher
            .publish_raw(&[outgoing(&queue, message, expires_in)?])
            .await
    }

    async fn send_all(&self, messages: &[(&str, &RpcMessage)]) -> Vec<Result<(), TransportError>> {
        // Messages that cannot be put on the wire fail alone; the others go in one go per
        // publisher: durable answers confirmed, transient ones not.
        let mut outcomes: Vec<Option<Result<(), TransportError>>> =
            Vec::with_capacity(messages.len());
        let (mut durable, mut transient) = (Vec::new(), Vec::new());
        for (i, (queue, message)) in messages.iter().enumerate() {
            match outgoing(&self.amqp.wire(Kind::Queue, queue), message, None) {
                Ok(out) if message.durable => durable.push((i, out)),
                Ok(out) => transient.push((i, out)),
                Err(e) => {
                    outcomes.resize_with(i + 1, || None);
                    outcomes[i] = Some(Err(e));
                }
            }
        }
        outcomes.resize_with(messages.len(), || None);
        for (publisher, group) in [(&self.publisher, durable), (&self.transient, transient)] {
            if group.is_empty() {
                continue;
            }
            let (places, ready): (Vec<usize>, Vec<Outgoing<'_>>) = group.into_iter().unzip();
            let sent = publisher.publish_raw_each(&ready).await;
            for (i, result) in places.into_iter().zip(sent) {
                outcomes[i] = Some(result);
            }
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(TransportError::unavailable("no outcome for a message sent"))
                })
            })
            .collect()
    }

    async fn undelivered(&self) -> u64 {
        let returned = self.transient.returned().await;
        for answer in &returned {
            tracing::info!(
                reply_to = %answer.delivery.routing_key,
                reason = %answer.reply_text,
                "an answer came back: its requester's queue is gone"
            );
        }
        returned.len() as u64
    }

    async fn serve(
        &self,
        queue: &str,
        consumer: &str,
        prefetch: u16,
    ) -> Result<Box<dyn RpcInbox>, TransportError> {
        let queue = &self.amqp.wire(Kind::Queue, queue);
        let channel = self.amqp.channel().await?;
        // On a cluster the requests' queue is replicated, so a node's death loses none.
        let mut args = FieldTable::default();
        if self.amqp.config().replicated {
            args.insert(
                "x-queue-type".into(),
                lapin::types::AMQPValue::LongString("quorum".into()),
            );
        }
        channel
            .queue_declare(
                short("queue", queue)?,
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                args,
            )
            .await
            .map_err(|e| classify_for(queue, e))?;
        self.consume(channel, queue.to_owned(), consumer, prefetch, false)
            .await
    }

    async fn replies(&self, durable: Option<&str>) -> Result<Box<dyn RpcInbox>, TransportError> {
        let durable = durable.map(|q| self.amqp.wire(Kind::Queue, q));
        let durable = durable.as_deref();
        let channel = self.amqp.channel().await?;
        let options = match durable {
            Some(_) => QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            // The seed's `queue_declare(queue="", exclusive=True)`: server-named, gone with
            // its connection.
            None => QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
        };
        let declared = channel
            .queue_declare(
                short("queue", durable.unwrap_or(""))?,
                options,
                FieldTable::default(),
            )
            .await
            .map_err(classify)?;
        let name = declared.name().to_string();
        let tag = format!("entrega.replies.{}", uuid_like(&name));
        self.consume(channel, name, &tag, 1000, durable.is_none())
            .await
    }
}

/// `message` for the queue `queue` through the default exchange, with the seed's properties:
/// `correlation_id`, `reply_to`, transient unless durable, and the expiry if given.
fn outgoing<'a>(
    queue: &str,
    message: &'a RpcMessage,
    expires_in: Option<Duration>,
) -> Result<Outgoing<'a>, TransportError> {
    let mut properties = properties_of(&message.headers, None)?
        .with_correlation_id(short("correlation id", &message.correlation_id)?)
        .with_delivery_mode(if message.durable { 2 } else { 1 });
    if let Some(reply_to) = &message.reply_to {
        properties = properties.with_reply_to(short("reply_to", reply_to)?);
    }
    if let Some(ttl) = expires_in {
        let ms = ttl.as_millis().max(1).to_string();
        properties = properties.with_expiration(short("expiration", &ms)?);
    }
    Ok(Outgoing {
        exchange: String::new(),
        routing_key: queue.to_owned(),
        payload: &message.payload,
        properties,
    })
}

/// A consumer tag derived from a queue name (tags are per channel; this keeps them readable).
fn uuid_like(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
        .collect()
}

/// A queue read with manual acks.
struct AmqpRpcInbox {
    address: String,
    channel: Channel,
    stream: Consumer,
    /// Deliveries are acknowledged by the broker as sent: `ack` and `retry` do nothing.
    no_ack: bool,
    /// Tags delivered and neither handled nor given back.
    open: BTreeSet<u64>,
    /// Tags handled whose acknowledgement waits for every lower tag to be settled, so that
    /// one `basic.ack` with `multiple` covers them all.
    handled: BTreeSet<u64>,
    /// The most handled tags held back; past it they are acknowledged one by one (a slow
    /// request must not keep the prefetch window full of finished ones).
    hold_max: usize,
}

impl AmqpRpcInbox {
    fn delivery(delivery: Delivery) -> RpcDelivery {
        let p = &delivery.properties;
        RpcDelivery {
            message: RpcMessage {
                correlation_id: p
                    .correlation_id()
                    .as_ref()
                    .map(|c| c.as_str().to_owned())
                    .unwrap_or_default(),
                reply_to: p.reply_to().as_ref().map(|r| r.as_str().to_owned()),
                headers: delivery_headers(p),
                durable: p.delivery_mode() == &Some(2),
                payload: delivery.data,
            },
            tag: delivery.delivery_tag,
            redelivered: delivery.redelivered,
        }
    }

    fn ended(&self) -> TransportError {
        TransportError::unavailable(format!(
            "the consumer of `{}` ended (cancelled by the broker, or its channel closed)",
            self.address
        ))
    }
}

#[async_trait]
impl RpcInbox for AmqpRpcInbox {
    fn address(&self) -> &str {
        &self.address
    }

    async fn next(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<RpcDelivery>, TransportError> {
        let first = match tokio::time::timeout(wait, self.stream.next()).await {
            Err(_) => return Ok(Vec::new()),
            Ok(None) => return Err(self.ended()),
            Ok(Some(delivery)) => delivery.map_err(classify)?,
        };
        let mut out = vec![Self::delivery(first)];
        while out.len() < max.max(1) {
            match self.stream.next().now_or_never() {
                Some(Some(Ok(delivery))) => out.push(Self::delivery(delivery)),
                Some(Some(Err(e))) => return Err(classify(e)),
                Some(None) | None => break,
            }
        }
        if !self.no_ack {
            self.open.extend(out.iter().map(|d| d.tag));
        }
        Ok(out)
    }

    async fn ack(&mut self, tag: u64) -> Result<(), TransportError> {
        self.ack_all(&[tag]).await
    }

    async fn ack_all(&mut self, tags: &[u64]) -> Result<(), TransportError> {
        if self.no_ack {
            return Ok(());
        }
        for tag in tags {
            self.open.remove(tag);
            self.handled.insert(*tag);
        }
        // Every tag below the lowest still open is settled: one frame acknowledges those
        // handled (the broker's tags of one channel grow in delivery order).
        let lowest_open = self.open.first().copied().unwrap_or(u64::MAX);
        let later = self.handled.split_off(&lowest_open);
        let covered = std::mem::replace(&mut self.handled, later);
        if let Some(top) = covered.last() {
            self.channel
                .basic_ack(*top, BasicAckOptions { multiple: true })
                .await
                .map_err(classify)?;
        }
        if self.handled.len() > self.hold_max {
            for tag in std::mem::take(&mut self.handled) {
                self.channel
                    .basic_ack(tag, BasicAckOptions::default())
                    .await
                    .map_err(classify)?;
            }
        }
        Ok(())
    }

    async fn retry(&mut self, tag: u64) -> Result<(), TransportError> {
        if self.no_ack {
            return Ok(());
        }
        self.open.remove(&tag);
        self.channel
            .basic_reject(tag, BasicRejectOptions { requeue: true })
            .await
            .map_err(classify)
    }
}

impl Drop for AmqpRpcInbox {
    fn drop(&mut self) {
        // Closing the channel hands every unacked delivery back to the broker.
        let channel = self.channel.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = channel.close(200, "entrega: inbox closed".into()).await;
            });
        }
    }
}
