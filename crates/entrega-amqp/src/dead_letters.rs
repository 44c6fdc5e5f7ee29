//! A group's dead-letter queue as an operator sees it: browsed without taking anything,
//! and letters taken off it one by one, after they were replayed (or to discard them).
//!
//! A browse consumes the queue with manual acks on a channel of its own and closes the
//! channel without acking: RabbitMQ puts every delivery back where it was (a classic queue
//! keeps its place on requeue). A take does the same and acks only the letters it was told
//! to, so the others stay, in order.

use std::time::Duration;

use entrega_core::headers::{INTENTOS, MOTIVO, NO_ANTES, ULTIMO_ERROR};
use entrega_core::{Headers, OutgoingMessage, TransportError};
use futures::StreamExt as _;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::Channel;

use crate::error::{classify, classify_for, short};
use crate::layout::QueueLayout;
use crate::link::Amqp;
use crate::properties::{delivery_headers, delivery_key};
use crate::publisher::{shard_of, AmqpPublisher, Routed};

/// Longest wait for the next delivery once the queue said how many it holds.
const IDLE: Duration = Duration::from_millis(500);
/// Most letters one session holds.
pub const MAX_SESSION: usize = 10_000;

/// One dead letter in a dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedLetter {
    /// Its place in the queue when read (0 is the head).
    pub position: usize,
    /// Its partitioning key.
    pub key: Option<String>,
    /// Its headers: the original ones plus `intentos`, `motivo` and the origin.
    pub headers: Headers,
    /// The original payload.
    pub payload: Vec<u8>,
    /// When it was published, epoch ms, when the publisher stamped it.
    pub timestamp_ms: Option<i64>,
}

/// The letters of a dead-letter queue, held unacked on a channel of their own until
/// [`LetterSession::close`]: acked ones leave the queue, the rest go back in order.
pub struct LetterSession {
    channel: Channel,
    held: Vec<(u64, QueuedLetter)>,
    amqp: Amqp,
    /// Replays go through one confirm channel for the whole session.
    publisher: AmqpPublisher,
}

impl std::fmt::Debug for LetterSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LetterSession")
            .field("letters", &self.held.len())
            .finish_non_exhaustive()
    }
}

impl LetterSession {
    /// The letters read, oldest first.
    pub fn letters(&self) -> Vec<&QueuedLetter> {
        self.held.iter().map(|(_, l)| l).collect()
    }

    /// Takes the letter at `position` off the queue for good.
    pub async fn remove(&mut self, position: usize) -> Result<(), TransportError> {
        let Some((tag, _)) = self.held.iter().find(|(_, l)| l.position == position) else {
            return Ok(());
        };
        self.channel
            .basic_ack(*tag, BasicAckOptions::default())
            .await
            .map_err(classify)
    }

    /// Publishes `letter` (read by this session) again to group `group`'s queue for `topic` only (its key's shard),
    /// confirmed, without the headers of its failed attempts (`intentos`, `motivo`,
    /// `no_antes`, `ultimo_error`), so it starts over; `extra` headers are added.
    pub async fn replay(
        &self,
        group: &str,
        topic: &str,
        letter: &QueuedLetter,
        extra: &Headers,
    ) -> Result<(), TransportError> {
        let q = self.amqp.group_queues(group, topic);
        let dropped = [INTENTOS, MOTIVO, NO_ANTES, ULTIMO_ERROR];
        let mut headers = Headers::new();
        for (name, value) in letter.headers.iter() {
            if !dropped.contains(&name) && extra.get(name).is_none() {
                headers.push(name, value);
            }
        }
        for (name, value) in extra.iter() {
            headers.set(name, value.to_owned());
        }
        let message = OutgoingMessage {
            topic: topic.to_owned(),
            key: letter.key.clone(),
            headers,
            payload: letter.payload.clone(),
        };
        let (exchange, routing_key) = match q.layout {
            QueueLayout::Sharded => (q.base.clone(), shard_of(&message, q.shards).to_string()),
            QueueLayout::Shared => (String::new(), q.base.clone()),
        };
        self.publisher
            .publish_routed(&[Routed {
                exchange,
                routing_key,
                message: &message,
            }])
            .await
    }

    /// Closes the session: every letter not removed goes back to the queue, in order.
    pub async fn close(self) {
        let _ = self
            .channel
            .close(200, "entrega: letters read".into())
            .await;
    }
}

impl Amqp {
    /// Opens `queue` (a dead-letter queue) and reads up to `max` of its letters, holding them.
    pub async fn open_letters(
        &self,
        queue: &str,
        max: usize,
    ) -> Result<LetterSession, TransportError> {
        let max = max.clamp(1, MAX_SESSION);
        let channel = self.channel().await?;
        let declared = channel
            .queue_declare(
                short("queue", queue)?,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| classify_for(queue, e))?;
        let want = max.min(usize::try_from(declared.message_count()).unwrap_or(max));
        let mut session = LetterSession {
            channel,
            held: Vec::with_capacity(want),
            amqp: self.clone(),
            publisher: AmqpPublisher::new(self.clone()),
        };
        if want == 0 {
            return Ok(session);
        }
        let prefetch = u16::try_from(want).unwrap_or(u16::MAX);
        session
            .channel
            .basic_qos(prefetch, BasicQosOptions { global: false })
            .await
            .map_err(classify)?;
        let mut consumer = session
            .channel
            .basic_consume(
                short("queue", queue)?,
                short("consumer tag", "entrega.dlq.reader")?,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(classify)?;
        while session.held.len() < want {
            let Ok(Some(next)) = tokio::time::timeout(IDLE, consumer.next()).await else {
                break;
            };
            let delivery = next.map_err(classify)?;
            let position = session.held.len();
            session
                .held
                .push((delivery.delivery_tag, letter_of(position, delivery)));
        }
        Ok(session)
    }
}

fn letter_of(position: usize, delivery: Delivery) -> QueuedLetter {
    QueuedLetter {
        position,
        key: delivery_key(&delivery.properties),
        headers: delivery_headers(&delivery.properties),
        timestamp_ms: delivery
            .properties
            .timestamp()
            .and_then(|t| i64::try_from(t.saturating_mul(1000)).ok()),
        payload: delivery.data,
    }
}
