//! Who else consumes a group: members announce themselves on the group's presence exchange,
//! each reads every announcement, and all of them compute the same share of shards from the
//! same list.
//!
//! RabbitMQ gives each shard queue one active consumer, the first to subscribe, so without
//! this the first member would hold every shard. With it, a member that is active on a shard
//! outside its share gives the shard up (its standby consumer comes back at the end of the
//! queue's waiting list), and the member whose share it is becomes active in its place.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use entrega_core::TransportError;
use futures::StreamExt as _;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, ExchangeKind};
use tokio::sync::mpsc;

use crate::error::{classify, short};
use crate::link::{Amqp, Kind};

/// How often a member announces itself.
pub(crate) const HEARTBEAT: Duration = Duration::from_millis(500);
/// A member not heard from for this long no longer counts.
pub(crate) const MEMBER_TTL: Duration = Duration::from_millis(2500);

/// Group `group`'s presence exchange on `topic`.
pub fn presence_exchange(group: &str, topic: &str) -> String {
    format!("{group}.{topic}.members")
}

/// One member's view of its group.
pub(crate) struct Presence {
    amqp: Amqp,
    channel: Channel,
    exchange: String,
    member: String,
    heard: mpsc::UnboundedSender<String>,
    seen: HashMap<String, Instant>,
    last_beat: Option<Instant>,
}

impl Presence {
    /// Declares the presence exchange and a private queue on it, and forwards every
    /// announcement heard to `heard`.
    pub(crate) async fn join(
        amqp: Amqp,
        group: &str,
        topic: &str,
        member: &str,
        heard: mpsc::UnboundedSender<String>,
    ) -> Result<Self, TransportError> {
        let exchange = amqp.wire(Kind::Exchange, &presence_exchange(group, topic));
        let channel = listen(&amqp, &exchange, member, heard.clone()).await?;
        let mut presence = Self {
            amqp,
            channel,
            exchange,
            member: member.to_owned(),
            heard,
            seen: HashMap::new(),
            last_beat: None,
        };
        presence.heard(format!("+{member}"));
        Ok(presence)
    }

    /// Listens again on a new channel when the old one is gone (the broker restarted, or
    /// closed it): without this the member would neither hear the others nor be heard, and
    /// would count itself alone. A failure is logged and tried again at the next beat.
    async fn rejoin_if_gone(&mut self) {
        if self.channel.status().connected() {
            return;
        }
        match listen(&self.amqp, &self.exchange, &self.member, self.heard.clone()).await {
            Ok(channel) => {
                tracing::info!(member = %self.member, "listening to the group's members again");
                self.channel = channel;
            }
            Err(e) => tracing::warn!(error = %e, "listening to the group's members again failed"),
        }
    }

    /// Notes an announcement: `+NAME`, a member present now; `-NAME`, a member leaving.
    pub(crate) fn heard(&mut self, announcement: String) {
        if let Some(name) = announcement.strip_prefix('-') {
            if name != self.member {
                self.seen.remove(name);
            }
        } else {
            let name = announcement.strip_prefix('+').unwrap_or(&announcement);
            self.seen.insert(name.to_owned(), Instant::now());
        }
    }

    /// Announces this member when a heartbeat is due, on a new channel if the old one is
    /// gone; a failure is only logged (the others stop counting this member, which hands
    /// its shards to them: safe, if slower).
    pub(crate) async fn beat(&mut self) {
        let now = Instant::now();
        if self
            .last_beat
            .is_some_and(|t| now.duration_since(t) < HEARTBEAT)
        {
            return;
        }
        self.last_beat = Some(now);
        self.rejoin_if_gone().await;
        self.heard(format!("+{}", self.member));
        self.announce('+').await;
    }

    /// Publishes `+NAME` or `-NAME` on the presence exchange.
    async fn announce(&self, sign: char) {
        let Ok(exchange) = short("exchange", &self.exchange) else {
            return;
        };
        let body = format!("{sign}{}", self.member);
        let mut headers = FieldTable::default();
        headers.insert(
            "entrega-member".into(),
            AMQPValue::LongString(LongString::from(self.member.as_bytes().to_vec())),
        );
        let sent = self
            .channel
            .basic_publish(
                exchange,
                "".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default()
                    .with_headers(headers)
                    .with_expiration(MEMBER_TTL.as_millis().to_string().into()),
            )
            .await;
        if let Err(e) = sent {
            tracing::warn!(error = %e, "announcing an AMQP group member failed");
        }
    }

    /// The members heard from within [`MEMBER_TTL`], this one included, sorted.
    pub(crate) fn members(&self) -> Vec<&str> {
        let now = Instant::now();
        let mut members: Vec<&str> = self
            .seen
            .iter()
            .filter(|(_, at)| now.duration_since(**at) < MEMBER_TTL)
            .map(|(m, _)| m.as_str())
            .collect();
        members.sort_unstable();
        members
    }

    /// Whether `shard` is this member's to hold: shards are dealt out round the sorted
    /// members, shard `s` to member `s % members`.
    pub(crate) fn owns(&self, shard: u32) -> bool {
        let members = self.members();
        let Some(me) = members.iter().position(|m| *m == self.member) else {
            return true;
        };
        let count = u32::try_from(members.len()).unwrap_or(u32::MAX).max(1);
        usize::try_from(shard % count).ok() == Some(me)
    }

    /// Leaves: tells the others at once (a member that dies without this counts until
    /// [`MEMBER_TTL`]), then closes the channel, which deletes the private queue.
    pub(crate) async fn leave(&self) {
        self.announce('-').await;
        let _ = self.channel.close(200, "entrega: leaving".into()).await;
    }
}

/// A new channel on which `member` hears every announcement of `exchange` (declared if
/// missing) through a private queue, forwarded to `heard`.
async fn listen(
    amqp: &Amqp,
    exchange: &str,
    member: &str,
    heard: mpsc::UnboundedSender<String>,
) -> Result<Channel, TransportError> {
    let channel = amqp.channel().await?;
    channel
        .exchange_declare(
            short("exchange", exchange)?,
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(classify)?;
    let queue = channel
        .queue_declare(
            short("queue", "")?,
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(classify)?;
    channel
        .queue_bind(
            queue.name().clone(),
            short("exchange", exchange)?,
            short("key", "")?,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(classify)?;
    let mut consumer = channel
        .basic_consume(
            queue.name().clone(),
            short("consumer tag", &format!("{member}.presence"))?,
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(classify)?;
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let name = String::from_utf8_lossy(&delivery.data).into_owned();
            if heard.send(name).is_err() {
                return;
            }
        }
    });
    Ok(channel)
}
