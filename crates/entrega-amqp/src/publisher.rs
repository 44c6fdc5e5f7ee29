//! Confirmed, `mandatory` publishing: a batch is `Ok` only once every message was confirmed by
//! the broker and routed to at least one queue.

use async_trait::async_trait;
use entrega_core::headers::ID_EVENTO;
use entrega_core::{partition_for, OutgoingMessage, Publisher, TransportError};
use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Confirmation};
use tokio::sync::Mutex;

use crate::error::{classify, classify_for};
use crate::in_order::{start_all, Started};
use crate::link::{Amqp, Kind};
use crate::properties::properties_of;

/// [`Publisher`] on RabbitMQ: each message goes to the exchange named by its topic, with its
/// shard as the routing key (Kafka's placement, [`partition_for`] of its key, `agregado_id`,
/// or of its `id_evento` when it has none, over [`AmqpConfig::shards`](crate::AmqpConfig)),
/// persistent, with publisher confirms and `mandatory`.
///
/// A message the broker acknowledges but returns unroutable (no queue bound for it) fails the
/// batch as [`TransportError::Rejected`]; a nack, a channel or connection lost before every
/// confirm came, or no confirm within `confirm_timeout`, fails it as
/// [`TransportError::Unavailable`]: whether the broker kept the messages is unknown, so the
/// caller publishes them again and consumers deduplicate. A missing exchange is
/// [`TransportError::UnknownTopic`].
pub struct AmqpPublisher {
    amqp: Amqp,
    /// Whether the broker confirms each message (else a batch is done once written).
    confirms: bool,
    /// The channel (in confirm mode if `confirms`), kept while it works.
    channel: Mutex<Option<Channel>>,
}

impl std::fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpPublisher").finish_non_exhaustive()
    }
}

impl AmqpPublisher {
    /// A publisher on `amqp`'s connection, with a channel of its own.
    pub fn new(amqp: Amqp) -> Self {
        Self {
            amqp,
            confirms: true,
            channel: Mutex::new(None),
        }
    }

    /// A publisher whose messages are done once written to the connection, with no confirm
    /// from the broker (so a broker that fails may lose them), still `mandatory`: a message
    /// no queue took comes back, and [`AmqpPublisher::returned`] reports it. For what a lost
    /// message costs only a timeout and a retry (a transient request, its reply).
    pub(crate) fn unconfirmed(amqp: Amqp) -> Self {
        Self {
            amqp,
            confirms: false,
            channel: Mutex::new(None),
        }
    }

    /// The messages of an unconfirmed publisher that the broker gave back since the last
    /// call, no queue having taken them: their routing keys and properties. Nothing while
    /// another caller is publishing (they stay for the next call).
    pub(crate) async fn returned(&self) -> Vec<lapin::message::BasicReturnMessage> {
        let channel = match self.channel.try_lock() {
            Ok(slot) => slot.clone(),
            Err(_) => return Vec::new(),
        };
        match channel {
            // Without confirm mode this waits for nothing: it hands over the returns.
            Some(channel) if !self.confirms => {
                channel.wait_for_confirms().await.unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }

    async fn confirm_channel(&self, slot: &mut Option<Channel>) -> Result<Channel, TransportError> {
        if let Some(channel) = slot.as_ref().filter(|c| c.status().connected()) {
            return Ok(channel.clone());
        }
        *slot = None;
        let channel = self.amqp.channel().await?;
        if self.confirms {
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(classify)?;
        }
        *slot = Some(channel.clone());
        Ok(channel)
    }
}

/// One message and where it goes: an exchange and a routing key.
pub(crate) struct Routed<'a> {
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) message: &'a OutgoingMessage,
}

/// One message ready for the wire: where it goes, its body and its AMQP properties.
pub(crate) struct Outgoing<'a> {
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) payload: &'a [u8],
    pub(crate) properties: lapin::BasicProperties,
}

impl AmqpPublisher {
    /// Publishes every message to its own exchange and key, confirmed and `mandatory`, with
    /// the outcomes of [`AmqpPublisher`]'s docs.
    pub(crate) async fn publish_routed(&self, batch: &[Routed<'_>]) -> Result<(), TransportError> {
        let outgoing = batch
            .iter()
            .map(|r| {
                Ok(Outgoing {
                    exchange: r.exchange.clone(),
                    routing_key: r.routing_key.clone(),
                    payload: &r.message.payload,
                    properties: properties_of(&r.message.headers, r.message.key.as_deref())?,
                })
            })
            .collect::<Result<Vec<_>, TransportError>>()?;
        self.publish_raw(&outgoing).await
    }

    /// Publishes messages whose properties are already built (request/reply sets its own):
    /// `Ok` only once every one was confirmed, else the first failure.
    pub(crate) async fn publish_raw(&self, batch: &[Outgoing<'_>]) -> Result<(), TransportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (channel, started) = self.start(batch).await?;
        self.finish(&channel, started).await.into_iter().collect()
    }

    /// Publishes every message as [`AmqpPublisher::publish_raw`] does, but with one outcome
    /// per message: one refused or unconfirmed message fails only itself.
    pub(crate) async fn publish_raw_each(
        &self,
        batch: &[Outgoing<'_>],
    ) -> Vec<Result<(), TransportError>> {
        match self.start(batch).await {
            Ok((channel, started)) => self.finish(&channel, started).await,
            Err(e) => same_for_all(batch.len(), &e),
        }
    }

    /// Queues `batch` on the confirm channel. The channel is held only while the batch is
    /// queued on it: batches of other callers are queued while this one is written and
    /// waits for its confirms.
    async fn start<'a>(
        &self,
        batch: &'a [Outgoing<'_>],
    ) -> Result<(Channel, Started<'a>), TransportError> {
        let mut slot = self.channel.lock().await;
        let channel = self.confirm_channel(&mut slot).await?;
        let started = start_all(&channel, batch).await;
        Ok((channel, started))
    }

    /// Waits for a started batch to be written and confirmed, each within the confirm
    /// timeout: one outcome per message, in order.
    async fn finish(
        &self,
        channel: &Channel,
        started: Started<'_>,
    ) -> Vec<Result<(), TransportError>> {
        let timeout = self.amqp.config().confirm_timeout;
        let n = started.len();
        let Ok(pending) = tokio::time::timeout(timeout, started.written()).await else {
            let e = TransportError::unavailable(format!(
                "RabbitMQ took no message within {} ms",
                timeout.as_millis()
            ));
            self.forget_if_closed(channel).await;
            return same_for_all(n, &e);
        };
        let nacked = std::sync::atomic::AtomicBool::new(false);
        let confirmed = pending.into_iter().map(|p| {
            let nacked = &nacked;
            async move {
                let (exchange, routing_key, confirm) = p?;
                match tokio::time::timeout(timeout, confirm).await {
                    Ok(Ok(Confirmation::NotRequested)) if !self.confirms => Ok(()),
                    Ok(confirmation) => {
                        if matches!(confirmation, Ok(Confirmation::Nack(_))) {
                            nacked.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        confirmed(&exchange, &routing_key, confirmation)
                    }
                    Err(_) => Err(TransportError::unavailable(format!(
                        "RabbitMQ confirmed no message within {} ms",
                        timeout.as_millis()
                    ))),
                }
            }
        });
        let outcomes = futures::future::join_all(confirmed).await;
        if nacked.into_inner() {
            self.forget(channel).await;
        } else if outcomes.iter().any(Result::is_err) {
            self.forget_if_closed(channel).await;
        }
        outcomes
    }

    /// Closes `channel` and makes the next batch open a new one. After a nack: on RabbitMQ
    /// 3.10 a channel that published to a quorum queue while its leader moved to another node
    /// was seen to nack every later publish, for minutes, while a new channel on the same
    /// connection stored them at once.
    async fn forget(&self, channel: &Channel) {
        {
            let mut slot = self.channel.lock().await;
            if slot.as_ref().is_some_and(|c| c.id() == channel.id()) {
                *slot = None;
            }
        }
        if channel.status().connected() {
            let _ = channel
                .close(200, "entrega: a new channel after a nack".into())
                .await;
        }
    }

    /// Once `channel` is gone, the next batch opens a new one (on a new connection too, if
    /// that is what failed; `Amqp::channel` checks).
    async fn forget_if_closed(&self, channel: &Channel) {
        if channel.status().connected() {
            return;
        }
        let mut slot = self.channel.lock().await;
        if slot.as_ref().is_some_and(|c| c.id() == channel.id()) {
            *slot = None;
        }
    }
}

/// `e` as the outcome of each of `n` messages.
fn same_for_all(n: usize, e: &TransportError) -> Vec<Result<(), TransportError>> {
    (0..n)
        .map(|_| {
            Err(if e.is_transient() {
                TransportError::unavailable(e.to_string())
            } else {
                TransportError::Rejected {
                    reason: e.to_string(),
                }
            })
        })
        .collect()
}

/// The shard of `message` among `shards`: Kafka's placement of its key, or of its
/// `id_evento` when it has none.
pub(crate) fn shard_of(message: &OutgoingMessage, shards: u32) -> u32 {
    let placed_by = message
        .key
        .as_deref()
        .or_else(|| message.headers.get(ID_EVENTO))
        .unwrap_or("");
    partition_for(placed_by, shards)
}

#[async_trait]
impl Publisher for AmqpPublisher {
    async fn publish(&self, batch: &[OutgoingMessage]) -> Result<(), TransportError> {
        let shards = self.amqp.config().shards;
        let routed: Vec<Routed<'_>> = batch
            .iter()
            .map(|message| Routed {
                exchange: self.amqp.wire(Kind::Exchange, &message.topic),
                routing_key: shard_of(message, shards).to_string(),
                message,
            })
            .collect();
        self.publish_routed(&routed).await
    }
}

/// What the broker's confirm of one message to `exchange` with `routing_key` means.
fn confirmed(
    exchange: &str,
    routing_key: &str,
    confirmation: lapin::Result<Confirmation>,
) -> Result<(), TransportError> {
    match confirmation.map_err(|e| classify_for(exchange, e))? {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(TransportError::Rejected {
            reason: format!(
                "no queue is bound to `{}` for key `{}` ({} {})",
                exchange, routing_key, returned.reply_code, returned.reply_text
            ),
        }),
        Confirmation::Nack(_) => Err(TransportError::unavailable(format!(
            "RabbitMQ refused to store a message of `{}` (nack)",
            exchange
        ))),
        Confirmation::NotRequested => Err(TransportError::unavailable(
            "the channel is not in confirm mode",
        )),
    }
}
