//! The queues and exchanges a consumer group needs, declared idempotently (and deleted).
//!
//! For group queues with base `B` on topic `T` ([`GroupQueues`]):
//!
//! - `T`: the topic, a durable fanout exchange;
//! - sharded layout: `B`, a direct exchange bound to `T`, routing shard `i` to the quorum
//!   queue `B.i` (single active consumer, explicit `x-delivery-limit`);
//! - shared layout: the classic queue `B`, bound to `T` directly, with exactly the seed's
//!   arguments;
//! - dead letters: every consumed queue has `x-dead-letter-exchange` = the shared direct
//!   exchange (`km0.dlx` in km0) and `x-dead-letter-routing-key` = `B`, which routes to the
//!   classic queue `B.dlq`: a message rejected without requeue, or past a quorum queue's
//!   delivery limit, lands there, never away;
//! - on a cluster ([`GroupQueues::replicated`]) `B.dlq` and the wait queues are quorum queues
//!   too, and the shard and wait queues dead-letter `at-least-once`;
//! - delayed retries: `B.wait` (topic exchange) routes key `<ms>.<shard>` to the wait queue
//!   `B.wait.<ms>` (declared on first use), whose messages expire after `<ms>` into
//!   `B.retry` (topic exchange), which routes `*.<i>` back to the consumed queue of shard `i`.
//!   One TTL per wait queue keeps its expiry order equal to its arrival order.
//!
//! The shard is computed by entrega rather than by the consistent-hash exchange plugin: the
//! plugin's ring on RabbitMQ 3.10 moves keys between queues when a queue is bound again,
//! which would hand one key's later messages to another shard while earlier ones wait.

use entrega_core::TransportError;
use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};

use crate::error::{classify_for, short};
use crate::layout::{wait_ms, GroupQueues, QueueLayout, WAIT_LEVELS};

/// Declares everything the group's queues need but the wait queues. Safe to repeat: a queue
/// deleted meanwhile comes back with the same bindings; a queue that exists with other
/// arguments fails with a precondition error, which names it.
pub async fn declare_group(channel: &Channel, q: &GroupQueues) -> Result<(), TransportError> {
    exchange(channel, &q.topic, ExchangeKind::Fanout).await?;
    exchange(channel, &q.dead_letter_exchange, ExchangeKind::Direct).await?;
    exchange(channel, &q.wait_exchange(), ExchangeKind::Topic).await?;
    exchange(channel, &q.return_exchange(), ExchangeKind::Topic).await?;
    let dlq = q.dead_letter_queue();
    queue(channel, &dlq, replicated(q, FieldTable::default())).await?;
    bind(channel, &dlq, &q.dead_letter_exchange, &q.base).await?;
    let mut args = FieldTable::default();
    text(&mut args, "x-dead-letter-exchange", &q.dead_letter_exchange);
    text(&mut args, "x-dead-letter-routing-key", &q.base);
    match q.layout {
        QueueLayout::Shared => {
            queue(channel, &q.base, args).await?;
            bind(channel, &q.base, &q.topic, "").await?;
            bind(channel, &q.base, &q.return_exchange(), "#").await?;
        }
        QueueLayout::Sharded => {
            exchange(channel, &q.base, ExchangeKind::Direct).await?;
            channel
                .exchange_bind(
                    short("exchange", &q.base)?,
                    short("topic", &q.topic)?,
                    short("key", "")?,
                    ExchangeBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| classify_for(&q.base, e))?;
            text(&mut args, "x-queue-type", "quorum");
            if q.replicated {
                at_least_once(&mut args);
            }
            args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(i64::from(q.delivery_limit)),
            );
            for shard in 0..q.shards {
                let name = q.queue(shard);
                queue(channel, &name, args.clone()).await?;
                bind(channel, &name, &q.base, &shard.to_string()).await?;
                bind(channel, &name, &q.return_exchange(), &format!("*.{shard}")).await?;
            }
        }
    }
    Ok(())
}

/// Declares the wait queue of `level` (see the module docs).
pub async fn declare_wait_queue(
    channel: &Channel,
    q: &GroupQueues,
    level: u32,
) -> Result<(), TransportError> {
    let name = q.wait_queue(level);
    let ms = wait_ms(level);
    let mut args = FieldTable::default();
    args.insert(
        "x-message-ttl".into(),
        AMQPValue::LongLongInt(i64::try_from(ms).unwrap_or(i64::MAX)),
    );
    text(&mut args, "x-dead-letter-exchange", &q.return_exchange());
    let args = replicated(q, args);
    queue(channel, &name, args).await?;
    bind(channel, &name, &q.wait_exchange(), &format!("{ms}.*")).await
}

/// Deletes the group's queues (with every message they hold, dead letters and waiting
/// retries included) and its exchanges; the topic's exchange and the shared dead-letter
/// exchange stay for the other groups. Missing ones are skipped.
pub async fn delete_group(channel: &Channel, q: &GroupQueues) -> Result<(), TransportError> {
    let mut queues = q.queues();
    queues.push(q.dead_letter_queue());
    queues.extend((0..WAIT_LEVELS).map(|l| q.wait_queue(l)));
    for name in queues {
        channel
            .queue_delete(short("queue", &name)?, QueueDeleteOptions::default())
            .await
            .map_err(|e| classify_for(&name, e))?;
    }
    let mut exchanges = vec![q.wait_exchange(), q.return_exchange()];
    if q.layout == QueueLayout::Sharded {
        exchanges.push(q.base.clone());
    }
    for name in exchanges {
        channel
            .exchange_delete(short("exchange", &name)?, ExchangeDeleteOptions::default())
            .await
            .map_err(|e| classify_for(&name, e))?;
    }
    Ok(())
}

/// Deletes the queue `name` with what it holds; a missing one is skipped.
pub async fn delete_queue(channel: &Channel, name: &str) -> Result<(), TransportError> {
    channel
        .queue_delete(short("queue", name)?, QueueDeleteOptions::default())
        .await
        .map(|_| ())
        .map_err(|e| classify_for(name, e))
}

/// Deletes the exchange `name`; a missing one is skipped.
pub async fn delete_exchange(channel: &Channel, name: &str) -> Result<(), TransportError> {
    channel
        .exchange_delete(short("exchange", name)?, ExchangeDeleteOptions::default())
        .await
        .map_err(|e| classify_for(name, e))
}

/// `args` for a quorum queue when the group's queues are replicated: on a cluster, a queue
/// on one node would be out of reach (and a wait queue's retries with it) while that node is
/// down.
fn replicated(q: &GroupQueues, mut args: FieldTable) -> FieldTable {
    if q.replicated {
        text(&mut args, "x-queue-type", "quorum");
        if args.inner().contains_key("x-dead-letter-exchange") {
            at_least_once(&mut args);
        }
    }
    args
}

/// Dead-lettering that keeps a message in its queue until the target queue confirmed it
/// (RabbitMQ's default for quorum queues drops it if the target is out of reach).
fn at_least_once(args: &mut FieldTable) {
    text(args, "x-dead-letter-strategy", "at-least-once");
    text(args, "x-overflow", "reject-publish");
}

fn text(args: &mut FieldTable, name: &str, value: &str) {
    args.insert(
        name.into(),
        AMQPValue::LongString(LongString::from(value.as_bytes().to_vec())),
    );
}

async fn exchange(channel: &Channel, name: &str, kind: ExchangeKind) -> Result<(), TransportError> {
    channel
        .exchange_declare(
            short("exchange", name)?,
            kind,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| classify_for(name, e))
}

async fn queue(channel: &Channel, name: &str, args: FieldTable) -> Result<(), TransportError> {
    channel
        .queue_declare(
            short("queue", name)?,
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await
        .map(|_| ())
        .map_err(|e| classify_for(name, e))
}

async fn bind(
    channel: &Channel,
    queue: &str,
    exchange: &str,
    key: &str,
) -> Result<(), TransportError> {
    channel
        .queue_bind(
            short("queue", queue)?,
            short("exchange", exchange)?,
            short("key", key)?,
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| classify_for(queue, e))
}
