//! What km0's consumer groups have not consumed yet, and what they set aside, over every
//! group and topic km0 runs: offsets behind the end on a log (the transport's own or
//! Kafka), messages ready or unacknowledged in the groups' queues on RabbitMQ.

use entrega_core::group_lag;

use crate::wiring::{Broker, AMQP_GROUPS};

/// Messages not consumed and messages dead-lettered, summed over km0's groups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Records (or queued messages) some group has not consumed yet.
    pub unconsumed: u64,
    /// Messages in the groups' dead-letter topics (or queues).
    pub dead_letters: u64,
}

impl Backlog {
    /// Reads the backlog of every group in [`AMQP_GROUPS`] (each group and the topic it
    /// consumes, whatever the broker).
    pub async fn read(broker: &Broker) -> anyhow::Result<Self> {
        let mut backlog = Self::default();
        if let Some(amqp) = broker.as_amqp() {
            for (group, topic, _) in AMQP_GROUPS {
                let names = amqp.group_queues(group, topic);
                let mut queues = names.queues();
                queues.push(names.dead_letter_queue());
                let depths = amqp.queue_depths(&queues).await?;
                for (n, depth) in depths.iter().enumerate() {
                    let held = depth.ready + depth.unacked.unwrap_or(0);
                    if n + 1 == depths.len() {
                        backlog.dead_letters += held;
                    } else {
                        backlog.unconsumed += held;
                    }
                }
            }
            return Ok(backlog);
        }
        let inspector = broker.inspector();
        let mut topics: Vec<&str> = Vec::new();
        for (group, topic, _) in AMQP_GROUPS {
            for partition in group_lag(inspector.as_ref(), group, topic).await? {
                backlog.unconsumed += u64::try_from(partition.lag()).unwrap_or(0);
            }
            if !topics.contains(&topic) {
                topics.push(topic);
            }
        }
        for topic in topics {
            backlog.dead_letters += broker.topic_total(&format!("{topic}.dlq")).await?;
        }
        Ok(backlog)
    }
}
