//! What a RabbitMQ process test asserts on: inventario's queues as the management API counts
//! them, and the end state every accepted order must reach.

#![allow(clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use entrega_amqp::QueueDepth;
use km0::services::inventario::{GROUP, TOPIC};

use super::kafka_state::orders::{assert_stock_less, Placed};
use super::state::DbState;

/// The depths of inventario's shard queues and of its dead-letter queue.
pub async fn depths(url: &str) -> (Vec<QueueDepth>, Vec<QueueDepth>) {
    let broker = entrega::Broker::connect(url, Duration::from_secs(10))
        .await
        .unwrap();
    km0::wiring::name_groups(&broker);
    let amqp = broker.as_amqp().unwrap();
    let names = amqp.group_queues(GROUP, TOPIC);
    let shards = amqp.queue_depths(&names.queues()).await.unwrap_or_default();
    let dead = amqp
        .queue_depths(&[names.dead_letter_queue()])
        .await
        .unwrap_or_default();
    broker.close().await;
    (shards, dead)
}

/// Every accepted order applied exactly once, on a stock that was `start`: the outbox
/// drained, one key per `pedido.creado` of `placed` and none else, the stock the start less
/// the orders.
pub async fn assert_applied_exactly_once(
    state: &DbState,
    placed: &[Placed],
    start: &BTreeMap<String, i64>,
) {
    assert_eq!(state.pending().await, 0, "outbox not drained");
    let keys: BTreeSet<String> = state.keys().await.into_iter().collect();
    let created: BTreeSet<String> = placed.iter().map(|p| p.created_id().to_owned()).collect();
    assert_eq!(
        keys.len(),
        created.len(),
        "{} keys for {} accepted orders",
        keys.len(),
        created.len()
    );
    assert_eq!(
        keys, created,
        "keys of other events, or orders never applied"
    );
    assert_stock_less(state, placed, start).await;
}
