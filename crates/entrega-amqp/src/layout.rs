//! How a consumer group's queues on one topic are laid out and named.

use std::time::Duration;

/// The shape of one group's queues on one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueLayout {
    /// [`AmqpConfig::shards`](crate::AmqpConfig) quorum queues `<base>.<i>`, each with a
    /// single active consumer and an explicit delivery limit: one key always lands in the same
    /// shard and is handled by one member at a time, in order, whatever the number of members.
    #[default]
    Sharded,
    /// One classic queue `<base>`, declared exactly as the seed declares
    /// `inventario.pedidos` (its dead-letter exchange and routing key, nothing else), so a
    /// service written the seed's way declares and consumes the same queue. Every member
    /// consumes it at once (plain competing consumers): RabbitMQ hands consecutive messages
    /// to different members, so one key's messages may be handled out of order, and a
    /// classic queue counts no deliveries, so it has no delivery limit.
    Shared,
}

/// What a group's queues on a topic are called and how they are shaped; see
/// [`Amqp::set_group`](crate::Amqp::set_group).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    /// The name every other name derives from; `<group>.<topic>` unless set.
    pub base: Option<String>,
    /// Sharded (ordered per key) or shared (the seed's plain queue).
    pub layout: QueueLayout,
}

/// The resolved names and settings of one group's queues on one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupQueues {
    /// The topic's fanout exchange.
    pub topic: String,
    /// The base name: the group's exchange, the shared queue, the shard queues' prefix, and
    /// the routing key of its dead letters.
    pub base: String,
    /// Sharded or shared.
    pub layout: QueueLayout,
    /// Shard queues (1 for the shared layout).
    pub shards: u32,
    /// The direct exchange dead letters go through (shared by every group).
    pub dead_letter_exchange: String,
    /// Deliveries a shard queue allows one message before dead-lettering it.
    pub delivery_limit: u32,
    /// Whether the dead-letter and wait queues are quorum queues, replicated across a
    /// cluster's nodes, and messages move between queues at least once (see
    /// [`AmqpConfig::replicated`](crate::AmqpConfig)).
    pub replicated: bool,
}

/// Shortest wait of a delayed retry, in milliseconds.
pub const WAIT_BASE_MS: u64 = 100;
/// Wait levels: level `l` holds messages `WAIT_BASE_MS * 2^l` ms, up to about 55 minutes.
pub const WAIT_LEVELS: u32 = 16;

impl GroupQueues {
    /// The queue consumed for shard `shard`.
    pub fn queue(&self, shard: u32) -> String {
        match self.layout {
            QueueLayout::Shared => self.base.clone(),
            QueueLayout::Sharded => format!("{}.{shard}", self.base),
        }
    }

    /// Every queue consumed, in shard order.
    pub fn queues(&self) -> Vec<String> {
        (0..self.shards).map(|s| self.queue(s)).collect()
    }

    /// The dead-letter queue: `<base>.dlq`, bound to the dead-letter exchange with key
    /// `<base>`.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.base)
    }

    /// The exchange delayed retries are published to (topic type, key `<wait ms>.<shard>`).
    pub fn wait_exchange(&self) -> String {
        format!("{}.wait", self.base)
    }

    /// The exchange expired retries come back through into the consumed queues (topic type,
    /// shard `i` bound with `*.<i>`).
    pub fn return_exchange(&self) -> String {
        format!("{}.retry", self.base)
    }

    /// The wait queue of `level`: `<base>.wait.<ms>`.
    pub fn wait_queue(&self, level: u32) -> String {
        format!("{}.wait.{}", self.base, wait_ms(level))
    }
}

/// How long a message waits at `level`, in milliseconds.
pub fn wait_ms(level: u32) -> u64 {
    WAIT_BASE_MS << level.min(WAIT_LEVELS - 1)
}

/// The level whose wait is the shortest one at least `delay` (the longest level for
/// anything longer): a retry waits at most twice its backoff, and never less.
pub fn wait_level(delay: Duration) -> u32 {
    let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    (0..WAIT_LEVELS)
        .find(|&l| wait_ms(l) >= ms)
        .unwrap_or(WAIT_LEVELS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(layout: QueueLayout) -> GroupQueues {
        GroupQueues {
            topic: "pedidos.eventos".into(),
            base: "inventario.pedidos".into(),
            layout,
            shards: if layout == QueueLayout::Shared { 1 } else { 3 },
            dead_letter_exchange: "km0.dlx".into(),
            delivery_limit: 20,
            replicated: false,
        }
    }

    #[test]
    fn names_derive_from_the_base() {
        let shared = queues(QueueLayout::Shared);
        assert_eq!(shared.queues(), vec!["inventario.pedidos"]);
        assert_eq!(shared.dead_letter_queue(), "inventario.pedidos.dlq");
        let sharded = queues(QueueLayout::Sharded);
        assert_eq!(
            sharded.queues(),
            vec![
                "inventario.pedidos.0",
                "inventario.pedidos.1",
                "inventario.pedidos.2"
            ]
        );
        assert_eq!(sharded.wait_queue(3), "inventario.pedidos.wait.800");
    }

    #[test]
    fn a_delay_waits_at_the_first_level_not_shorter() {
        assert_eq!(wait_level(Duration::ZERO), 0);
        assert_eq!(wait_level(Duration::from_millis(100)), 0);
        assert_eq!(wait_level(Duration::from_millis(101)), 1);
        assert_eq!(wait_ms(wait_level(Duration::from_secs(1))), 1600);
        assert_eq!(wait_ms(wait_level(Duration::from_secs(60))), 102_400);
        assert_eq!(wait_level(Duration::from_secs(86_400)), WAIT_LEVELS - 1);
    }
}
