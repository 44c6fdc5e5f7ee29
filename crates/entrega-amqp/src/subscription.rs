//! A consumer group member on RabbitMQ: one consumer per shard queue, deliveries held unacked
//! until the worker commits, offsets counted per shard by this member.
//!
//! RabbitMQ has no offsets. A member numbers the deliveries of each shard as they arrive
//! (from 0, per subscription of the shard), and a commit of next offset `n` acks every
//! delivery below `n` at once (`basic.ack` with `multiple`). A seek back serves deliveries
//! still held again, in order, without asking the broker (a requeue would break a quorum
//! queue's order); a pause holds the shard back. When the broker cancels a consumer or the
//! channel closes, the deliveries it held are the broker's again (it redelivers them, to this
//! member or another), commits for the shard fail with [`TransportError::NotAssigned`] until
//! it is subscribed again, on a later poll, and its numbering then goes on from where it was.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use entrega_core::{now_ms, Record, Subscriber, Subscription, TransportError};
use futures::StreamExt as _;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::Channel;
use tokio::sync::mpsc;

use crate::error::{classify, short};
use crate::layout::{GroupQueues, QueueLayout};
use crate::link::Amqp;
use crate::presence::Presence;
use crate::properties::{delivery_headers, delivery_key};
use crate::topology::declare_group;

/// [`Subscriber`] on RabbitMQ: each group's queues per topic laid out as
/// [`Amqp::group_queues`] says (see [`crate::topology`]).
#[derive(Debug, Clone)]
pub struct AmqpSubscriber {
    amqp: Amqp,
}

impl AmqpSubscriber {
    /// Members of groups on `amqp`'s connection.
    pub fn new(amqp: Amqp) -> Self {
        Self { amqp }
    }
}

#[async_trait]
impl Subscriber for AmqpSubscriber {
    async fn subscribe(
        &self,
        group: &str,
        topic: &str,
        member: &str,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        let queues = self.amqp.group_queues(group, topic);
        let channel = self.amqp.channel().await?;
        let declared = declare_group(&channel, &queues).await;
        let _ = channel.close(200, "entrega: declared".into()).await;
        declared?;
        let (events, inbox) = mpsc::unbounded_channel();
        let (heard_tx, heard) = mpsc::unbounded_channel();
        let presence = Presence::join(self.amqp.clone(), group, topic, member, heard_tx).await?;
        let mut subscription = AmqpSubscription {
            presence,
            heard,
            amqp: self.amqp.clone(),
            group: group.to_owned(),
            topic: topic.to_owned(),
            member: member.to_owned(),
            shards: (0..queues.shards).map(|_| Shard::default()).collect(),
            queues,
            events,
            inbox,
        };
        for shard in 0..subscription.queues.shards {
            subscription.consume(shard).await?;
        }
        Ok(Box::new(subscription))
    }
}

/// What the forwarding task of a shard reports.
enum Event {
    /// A delivery of the shard's consumer of `generation`.
    Delivered {
        shard: u32,
        generation: u64,
        delivery: Box<Delivery>,
    },
    /// That consumer ended: cancelled by the broker, or its channel closed.
    Ended { shard: u32, generation: u64 },
}

/// A delivery held unacked.
struct Held {
    offset: i64,
    tag: u64,
    record: Record,
}

impl Shard {
    /// Ends this member's subscription of the shard: the deliveries it held are the
    /// broker's again, and commits of their offsets fail from now on. Returns the channel,
    /// for the caller to close when it is still open.
    fn forget(&mut self) -> Option<Channel> {
        self.held.clear();
        self.active = false;
        self.generation += 1;
        self.channel.take()
    }
}

#[derive(Default)]
struct Shard {
    /// The consumer's channel, while it consumes.
    channel: Option<Channel>,
    /// Bumped every time the shard is subscribed again; events of older ones are stale.
    generation: u64,
    /// Offset the next delivery gets.
    next_offset: i64,
    /// Deliveries not yet acked, in offset order.
    held: VecDeque<Held>,
    /// Next offset to hand to the worker.
    position: i64,
    /// No records of this shard before this instant.
    paused_until: Option<Instant>,
    /// Whether this member received a delivery of the current subscription: with a single
    /// active consumer per queue, that is when it knows it holds the shard.
    active: bool,
    /// When this member last handed the shard over. Every hand-over returns the held
    /// deliveries to the queue, which counts a delivery attempt against the quorum queue's
    /// limit, so a shard comes back to a member only once per [`MEMBER_TTL`] before it is
    /// kept and served: its owner (listed, but dead or not yet consuming) is not taking it.
    ///
    /// [`MEMBER_TTL`]: crate::presence::MEMBER_TTL
    handed_over: Option<Instant>,
}

/// One member's consumers of one group's shard queues.
pub struct AmqpSubscription {
    presence: Presence,
    heard: mpsc::UnboundedReceiver<String>,
    amqp: Amqp,
    group: String,
    topic: String,
    member: String,
    queues: GroupQueues,
    shards: Vec<Shard>,
    events: mpsc::UnboundedSender<Event>,
    inbox: mpsc::UnboundedReceiver<Event>,
}

impl std::fmt::Debug for AmqpSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSubscription")
            .field("group", &self.group)
            .field("topic", &self.topic)
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

impl AmqpSubscription {
    /// Starts consuming shard `shard` on a channel of its own, with `prefetch` unacked
    /// deliveries at most, and a task forwarding its deliveries.
    async fn consume(&mut self, shard: u32) -> Result<(), TransportError> {
        let index = shard as usize;
        let queue = self.queues.queue(shard);
        let channel = self.amqp.channel().await?;
        channel
            .basic_qos(
                self.amqp.config().prefetch,
                BasicQosOptions { global: false },
            )
            .await
            .map_err(classify)?;
        let mut consumer = channel
            .basic_consume(
                short("queue", &queue)?,
                short("consumer tag", &format!("{}.{shard}", self.member))?,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(classify)?;
        let state = &mut self.shards[index];
        state.generation += 1;
        // Numbering goes on from the last subscription of this shard: an offset never names
        // two deliveries of one member, so a commit meant for the old subscription acks
        // nothing of the new one, and what the worker remembers of old offsets (attempts,
        // outcomes) never applies to a new delivery.
        state.position = state.next_offset;
        state.held.clear();
        state.active = false;
        state.channel = Some(channel);
        let generation = state.generation;
        let events = self.events.clone();
        tokio::spawn(async move {
            while let Some(delivery) = consumer.next().await {
                let Ok(delivery) = delivery else { break };
                let event = Event::Delivered {
                    shard,
                    generation,
                    delivery: Box::new(delivery),
                };
                if events.send(event).is_err() {
                    return;
                }
            }
            let _ = events.send(Event::Ended { shard, generation });
        });
        Ok(())
    }

    fn apply(&mut self, event: Event) {
        match event {
            Event::Delivered {
                shard,
                generation,
                delivery,
            } => {
                let Some(state) = self.shards.get_mut(shard as usize) else {
                    return;
                };
                if state.generation != generation {
                    return;
                }
                let topic = self.topic.clone();
                let offset = state.next_offset;
                state.next_offset += 1;
                state.active = true;
                let record = Record {
                    topic,
                    partition: shard,
                    offset,
                    key: delivery_key(&delivery.properties),
                    headers: delivery_headers(&delivery.properties),
                    timestamp_ms: delivery
                        .properties
                        .timestamp()
                        .and_then(|t| i64::try_from(t.saturating_mul(1000)).ok())
                        .unwrap_or_else(now_ms),
                    payload: delivery.data,
                };
                state.held.push_back(Held {
                    offset,
                    tag: delivery.delivery_tag,
                    record,
                });
            }
            Event::Ended { shard, generation } => {
                let Some(state) = self.shards.get_mut(shard as usize) else {
                    return;
                };
                if state.generation == generation {
                    tracing::warn!(
                        group = %self.group,
                        topic = %self.topic,
                        shard,
                        "AMQP consumer ended (cancelled by the broker or channel closed); \
                         subscribing again"
                    );
                    state.forget();
                }
            }
        }
    }

    /// Records ready to hand out, up to `max`, shard by shard in offset order.
    fn ready(&mut self, max: usize) -> Vec<Record> {
        let now = Instant::now();
        let mut out = Vec::new();
        for state in &mut self.shards {
            if state.paused_until.is_some_and(|t| t > now) {
                continue;
            }
            state.paused_until = None;
            let from = state.position;
            for held in state.held.iter().filter(|h| h.offset >= from) {
                if out.len() >= max {
                    return out;
                }
                out.push(held.record.clone());
                state.position = held.offset + 1;
            }
        }
        out
    }

    /// Gives up every shard this member is active on that is another member's share: its
    /// channel closes, so what it held goes back to the broker and on to the next consumer in
    /// the queue's waiting list, and the shard is subscribed again (as a standby) next.
    async fn release_foreign(&mut self) {
        if self.queues.layout == QueueLayout::Shared {
            // Every member consumes the one queue: there is nothing to hand over.
            return;
        }
        for (shard, state) in (0u32..).zip(self.shards.iter_mut()) {
            let recently = state
                .handed_over
                .is_some_and(|t| t.elapsed() < crate::presence::MEMBER_TTL);
            if state.active && state.channel.is_some() && !recently && !self.presence.owns(shard) {
                state.handed_over = Some(Instant::now());
                tracing::info!(group = %self.group, topic = %self.topic, shard,
                    "handing an AMQP shard over to the member whose share it is");
                if let Some(channel) = state.forget() {
                    let _ = channel.close(200, "entrega: handing over".into()).await;
                }
            }
        }
    }

    /// Subscribes again every shard whose consumer ended, declaring the group's topology
    /// again first (the broker may have lost or deleted a queue: that is one way a consumer
    /// is cancelled). A failure leaves the shard for the next poll.
    async fn resubscribe(&mut self) {
        if self.shards.iter().all(|s| s.channel.is_some()) {
            return;
        }
        let declared = match self.amqp.channel().await {
            Ok(channel) => {
                let declared = declare_group(&channel, &self.queues).await;
                let _ = channel.close(200, "entrega: declared".into()).await;
                declared
            }
            Err(e) => Err(e),
        };
        if let Err(e) = declared {
            tracing::warn!(group = %self.group, topic = %self.topic, error = %e,
                "declaring an AMQP group again failed");
            return;
        }
        for shard in 0..self.shards.len() {
            if self.shards[shard].channel.is_none() {
                let shard = u32::try_from(shard).unwrap_or(u32::MAX);
                if let Err(e) = self.consume(shard).await {
                    tracing::warn!(shard, error = %e, "subscribing an AMQP shard again failed");
                    return;
                }
            }
        }
    }
}

#[async_trait]
impl Subscription for AmqpSubscription {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Record>, TransportError> {
        let deadline = Instant::now() + wait;
        loop {
            self.presence.beat().await;
            while let Ok(member) = self.heard.try_recv() {
                self.presence.heard(member);
            }
            while let Ok(event) = self.inbox.try_recv() {
                self.apply(event);
            }
            self.release_foreign().await;
            self.resubscribe().await;
            let ready = self.ready(max.max(1));
            if !ready.is_empty() {
                return Ok(ready);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            // Wake for the next delivery, the end of a pause, the next heartbeat, or the
            // deadline.
            let until = self
                .shards
                .iter()
                .filter_map(|s| s.paused_until)
                .filter(|t| *t > now)
                .min()
                .map_or(deadline, |t| t.min(deadline))
                .min(now + crate::presence::HEARTBEAT);
            if let Ok(Some(event)) = tokio::time::timeout(until - now, self.inbox.recv()).await {
                self.apply(event);
            }
        }
    }

    async fn commit(&mut self, offsets: &[(u32, i64)]) -> Result<(), TransportError> {
        let mut lost = None;
        for &(partition, next) in offsets {
            let not_assigned = TransportError::NotAssigned {
                topic: self.topic.clone(),
                partition,
            };
            let Some(state) = self.shards.get_mut(partition as usize) else {
                lost.get_or_insert(not_assigned);
                continue;
            };
            let Some(channel) = state.channel.clone().filter(|_| state.active) else {
                lost.get_or_insert(not_assigned);
                continue;
            };
            let Some(last) = state.held.iter().rev().find(|h| h.offset < next) else {
                // Nothing held below `next`: acked already (or never delivered here).
                continue;
            };
            let tag = last.tag;
            match channel
                .basic_ack(tag, BasicAckOptions { multiple: true })
                .await
            {
                Ok(()) => state.held.retain(|h| h.offset >= next),
                Err(e) => {
                    // The channel is gone, and its unacked deliveries with it: the broker
                    // delivers them again.
                    tracing::warn!(partition, error = %e, "AMQP ack failed");
                    state.forget();
                    lost.get_or_insert(not_assigned);
                }
            }
        }
        lost.map_or(Ok(()), Err)
    }

    fn seek(&mut self, partition: u32, offset: i64) {
        if let Some(state) = self.shards.get_mut(partition as usize) {
            let first = state.held.front().map_or(state.next_offset, |h| h.offset);
            state.position = offset.max(first);
        }
    }

    fn pause_for(&mut self, partition: u32, until: Duration) {
        if let Some(state) = self.shards.get_mut(partition as usize) {
            state.paused_until = Some(Instant::now() + until);
        }
    }

    fn assignment(&self) -> Vec<u32> {
        (0u32..)
            .zip(&self.shards)
            .filter(|(_, s)| s.active && s.channel.is_some())
            .map(|(p, _)| p)
            .collect()
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        self.presence.leave().await;
        // Closing the channels hands every unacked delivery back to the broker at once.
        for state in &mut self.shards {
            if let Some(channel) = state.forget() {
                let _ = channel.close(200, "entrega: leaving".into()).await;
            }
        }
        Ok(())
    }
}
